"""Rate and size limits on the agent API, counted in the real Redis so they hold across workers."""

from __future__ import annotations

import time

import pytest
import redis
import time_machine
from django.http import HttpResponse
from django.test import RequestFactory

from agent import protocol
from nodes import ratelimit
from nodes.ratelimit import HEARTBEAT, REGISTER, AgentAPILimitMiddleware, Limiter


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
    ratelimit.reset_client()
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


def test_heartbeats_are_limited_per_token(limits):
    view = View(200)
    middleware = AgentAPILimitMiddleware(view)
    answers = [middleware(post(HEARTBEAT, token="node-a")).status_code for _ in range(7)]
    assert answers == [200] * 5 + [429] * 2
    # The same address with another node's token is fine: nodes behind one NAT are many nodes.
    assert middleware(post(HEARTBEAT, token="node-b")).status_code == 200


def test_tokens_are_never_stored_in_redis(limits, redis_client):
    AgentAPILimitMiddleware(View())(post(HEARTBEAT, token="secret-node-token"))
    keys = [key.decode() for key in redis_client.keys(ratelimit.PREFIX + "*")]
    assert keys
    assert not any("secret-node-token" in key for key in keys)
    for key in keys:
        assert b"secret-node-token" not in (redis_client.get(key) or b"")


def test_an_address_guessing_tokens_is_refused_for_the_minute(limits):
    refused_view = View(401)
    guessing = AgentAPILimitMiddleware(refused_view)
    for i in range(4):
        assert guessing(post(HEARTBEAT, token=f"guess-{i}")).status_code == 401
    # From now on even the right token from that address gets no answer from the view.
    honest = View(200)
    middleware = AgentAPILimitMiddleware(honest)
    response = middleware(post(HEARTBEAT, token="right"))
    assert response.status_code == 429
    assert protocol.decode(response.content, protocol.Rejection).field == "authorization"
    assert honest.calls == 0
    assert middleware(post(HEARTBEAT, token="right", address="10.0.0.9")).status_code == 200


def test_other_paths_are_not_counted(limits, redis_client):
    view = View()
    middleware = AgentAPILimitMiddleware(view)
    for _ in range(10):
        assert middleware(RequestFactory().get("/healthz")).status_code == 200
    assert redis_client.keys(ratelimit.PREFIX + "*") == []


def test_without_redis_the_limits_are_lifted_not_the_fleet(limits, settings, caplog):
    settings.REDIS_URL = "redis://127.0.0.1:1/0"  # nothing listens there
    ratelimit.reset_client()
    ratelimit._last_warning = 0.0
    try:
        view = View(201)
        middleware = AgentAPILimitMiddleware(view)
        started = time.monotonic()
        assert [middleware(post(REGISTER)).status_code for _ in range(5)] == [201] * 5
        # And without waiting on retries: an outage must not slow every agent request down.
        assert time.monotonic() - started < 2
        # Said once, not once per request.
        assert len([r for r in caplog.records if r.name == "nodes.ratelimit"]) <= 1
    finally:
        ratelimit.reset_client()


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
