"""Rate limits on the agent API, counted in the real Redis so they hold across workers.

Both limits are applied in the views, registrations once the join token is
known good, heartbeats in the round trip that admits them; tested here and in
test_security_agent_api.py and test_security_lockout.py through the real views.
"""

from __future__ import annotations

import time

import pytest
import time_machine

import livestate
from agent import protocol
from livestate.keys import LIMIT_PREFIX
from nodes import ratelimit
from tests.agentapi import JOIN_TOKEN, a_load, heartbeat, register
from tests.factories import make_inventory


def post_register(client, node_id: str, token: str = JOIN_TOKEN, address: str = "10.0.0.1", **headers):
    message = protocol.Register(node_id=node_id, inventory=make_inventory(f"{node_id}.example"))
    return client.post(
        "/api/v1/register",
        data=protocol.encode(message),
        content_type="application/json",
        headers={"Authorization": f"Bearer {token}", **headers},
        REMOTE_ADDR=address,
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


@pytest.mark.django_db
def test_registration_is_limited_per_address_across_workers(limits, client):
    limits.LLMGW_JOIN_TOKEN = JOIN_TOKEN
    answers = []
    for i in range(5):
        # A new client each time: what holds the count is Redis, not the process.
        livestate.reset_client()
        answers.append(post_register(client, f"n-{i}").status_code)
    assert answers == [200, 200, 200, 429, 429]
    refused = post_register(client, "n-5")
    assert 0 < int(refused["Retry-After"]) <= 60
    assert protocol.decode(refused.content, protocol.Rejection).field == "rate"
    # Another address is not held back by the first one's flood.
    assert post_register(client, "n-6", address="10.0.0.2").status_code == 200


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


@pytest.mark.django_db
def test_an_address_guessing_join_tokens_has_its_guesses_refused_for_the_minute(limits, client):
    limits.LLMGW_JOIN_TOKEN = JOIN_TOKEN
    limits.LLMGW_REGISTER_PER_MINUTE = 100
    for i in range(4):
        assert post_register(client, f"x-{i}", token="guessed-join-token").status_code == 401
    response = post_register(client, "x-5", token="guessed-join-token")
    assert response.status_code == 429
    assert protocol.decode(response.content, protocol.Rejection).field == "authorization"
    # The right token from the same address still registers.
    assert post_register(client, "honest").status_code == 200
    assert post_register(client, "x-6", token="guessed-join-token", address="10.0.0.9").status_code == 401


@pytest.mark.django_db
def test_other_paths_are_not_counted(limits, client, redis_client):
    for _ in range(10):
        assert client.get("/healthz").status_code == 200
    assert redis_client.keys(LIMIT_PREFIX + "*") == []


@pytest.mark.django_db
def test_without_redis_the_limits_are_lifted_not_the_fleet(limits, client, settings, caplog):
    settings.LLMGW_JOIN_TOKEN = JOIN_TOKEN
    settings.REDIS_URL = "redis://127.0.0.1:1/0"  # nothing listens there
    livestate.reset_client()
    ratelimit.warn_unlimited.reset()
    try:
        started = time.monotonic()
        assert [post_register(client, f"n-{i}").status_code for i in range(5)] == [200] * 5
        # And without waiting on retries: an outage must not slow every agent request down.
        assert time.monotonic() - started < 2
        # Said once, not once per request.
        assert len([r for r in caplog.records if r.name == "nodes.ratelimit"]) <= 1
    finally:
        livestate.reset_client()


@pytest.mark.django_db
def test_behind_a_proxy_the_forwarded_address_counts_not_a_spoofed_one(limits, client):
    limits.LLMGW_JOIN_TOKEN = JOIN_TOKEN
    limits.LLMGW_PROXY_HOPS = 1
    # Every request comes from the proxy; the client puts a new fake address in front each time.
    answers = [
        post_register(
            client, f"n-{i}", address="192.0.2.1", **{"X-Forwarded-For": f"1.1.1.{i}, 203.0.113.7"}
        ).status_code
        for i in range(4)
    ]
    assert answers == [200, 200, 200, 429]
    other = post_register(client, "n-9", address="192.0.2.1", **{"X-Forwarded-For": "203.0.113.8"})
    assert other.status_code == 200
