"""Rate limits on the agent API, counted in the real Redis so they hold across workers.

Registration is limited by the middleware, tested here with a stand-in view;
heartbeats are limited in the round trip that admits them, tested here and in
test_security_agent_api.py through the real view.
"""

from __future__ import annotations

import time

import pytest
import redis
import time_machine
from django.http import HttpResponse
from django.test import RequestFactory

import livestate
from agent import protocol
from livestate.keys import LIMIT_PREFIX
from livestate.limits import Limiter
from tests.agentapi import JOIN_TOKEN, a_load, heartbeat, register
from web import ratelimit
from web.ratelimit import REGISTER, AgentAPILimitMiddleware


class View:
    """Stands in for the agent API views: counts calls, answers a chosen status."""

    def __init__(self, status: int = 200):
        self.status = status
        self.calls = 0

    def __call__(self, request):
        self.calls += 1
        return HttpResponse(status=self.status)


def post(path: str, address: str = "10.0.0.1", token: str = "t0k3n", body: bytes = b"{}", **headers):
    return RequestFactory().post(
        path,
        data=body,
        content_type="application/json",
        REMOTE_ADDR=address,
        headers={"Authorization": f"Bearer {token}", **headers},
    )


@pytest.fixture
def limits(settings, redis_client):
    livestate.reset_client()
    settings.LLMGW_REGISTER_PER_MINUTE = 3
    settings.LLMGW_HEARTBEAT_PER_MINUTE = 5
    settings.LLMGW_AUTH_FAILURES_PER_MINUTE = 4
    settings.LLMGW_PROXY_HOPS = 0
    # Windows are whole minutes: a test must not straddle two of them.
    with time_machine.travel(1_800_000_000.0, tick=False):
        yield settings


def test_registration_is_limited_per_address_across_workers(limits):
    # Two middleware instances with their own Redis connections: two gunicorn workers.
    view = View(201)
    workers = [AgentAPILimitMiddleware(view, Limiter(redis.Redis.from_url(limits.REDIS_URL))) for _ in range(2)]
    answers = [workers[i % 2](post(REGISTER)).status_code for i in range(5)]
    assert answers == [201, 201, 201, 429, 429]
    assert view.calls == 3
    refused = workers[0](post(REGISTER))
    assert 0 < int(refused["Retry-After"]) <= 60
    assert protocol.decode(refused.content, protocol.Rejection).field == "rate"
    # Another address is not held back by the first one's flood.
    assert workers[1](post(REGISTER, address="10.0.0.2")).status_code == 201


@pytest.mark.django_db
def test_heartbeats_are_limited_per_token_whichever_worker_answers(limits, client, redis_client):
    limits.LLMGW_JOIN_TOKEN = JOIN_TOKEN
    token_a, token_b = register(client, "node-a"), register(client, "node-b")
    answers = []
    for i in range(7):
        # A new client each time: what holds the count is Redis, not the process.
        livestate.reset_client()
        answers.append(heartbeat(client, token_a, protocol.Heartbeat(load=a_load(float(i)))).status_code)
    assert answers == [200] * 5 + [429] * 2
    # The same address with another node's token is fine: nodes behind one NAT are many nodes.
    assert heartbeat(client, token_b, protocol.Heartbeat()).status_code == 200


@pytest.mark.django_db
def test_no_token_or_secret_is_stored_in_redis(limits, client, redis_client):
    limits.LLMGW_JOIN_TOKEN = JOIN_TOKEN
    token = register(client, "node-a")
    heartbeat(client, token, protocol.Heartbeat(load=a_load()))
    heartbeat(client, "node-a.a-wrong-secret", protocol.Heartbeat())
    secret = token.rpartition(".")[2]
    keys = redis_client.keys("*")
    assert any(key.startswith(LIMIT_PREFIX.encode()) for key in keys)
    for key in keys:
        kind = redis_client.type(key)
        values = [redis_client.get(key)] if kind == b"string" else []
        if kind == b"hash":
            values = [*redis_client.hkeys(key), *redis_client.hvals(key)]
        for stored in [key, *values]:
            assert secret.encode() not in stored and b"a-wrong-secret" not in stored, key


def test_an_address_guessing_tokens_is_refused_for_the_minute(limits):
    limits.LLMGW_REGISTER_PER_MINUTE = 100  # the guesses, not the registrations, must be what stops it
    refused_view = View(401)
    guessing = AgentAPILimitMiddleware(refused_view)
    for _ in range(4):
        assert guessing(post(REGISTER, token="guessed-join-token")).status_code == 401
    # From now on even the right token from that address gets no answer from the view.
    honest = View(200)
    middleware = AgentAPILimitMiddleware(honest)
    response = middleware(post(REGISTER, token="right"))
    assert response.status_code == 429
    assert protocol.decode(response.content, protocol.Rejection).field == "authorization"
    assert honest.calls == 0
    assert middleware(post(REGISTER, token="right", address="10.0.0.9")).status_code == 200


def test_other_paths_are_not_counted(limits, redis_client):
    view = View()
    middleware = AgentAPILimitMiddleware(view)
    for _ in range(10):
        assert middleware(RequestFactory().get("/healthz")).status_code == 200
    assert redis_client.keys(LIMIT_PREFIX + "*") == []


def test_without_redis_the_limits_are_lifted_not_the_fleet(limits, settings, caplog):
    settings.REDIS_URL = "redis://127.0.0.1:1/0"  # nothing listens there
    livestate.reset_client()
    ratelimit.warn_unlimited.reset()
    try:
        view = View(201)
        middleware = AgentAPILimitMiddleware(view)
        started = time.monotonic()
        assert [middleware(post(REGISTER)).status_code for _ in range(5)] == [201] * 5
        # And without waiting on retries: an outage must not slow every agent request down.
        assert time.monotonic() - started < 2
        # Said once, not once per request.
        assert len([r for r in caplog.records if r.name == "web.ratelimit"]) <= 1
    finally:
        livestate.reset_client()


def test_behind_a_proxy_the_forwarded_address_counts_not_a_spoofed_one(limits):
    limits.LLMGW_PROXY_HOPS = 1
    view = View(201)
    middleware = AgentAPILimitMiddleware(view)
    # Every request comes from the proxy; the client puts a new fake address in front each time.
    answers = [
        middleware(post(REGISTER, address="192.0.2.1", **{"X-Forwarded-For": f"1.1.1.{i}, 203.0.113.7"})).status_code
        for i in range(4)
    ]
    assert answers == [201, 201, 201, 429]
    other = post(REGISTER, address="192.0.2.1", **{"X-Forwarded-For": "203.0.113.8"})
    assert middleware(other).status_code == 201
