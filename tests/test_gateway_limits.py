"""Tenants' limits at the gateway: a real HAProxy programmed by the sync, in front of a real demo engine.

Requests per second and requests in flight, per tenant, are counted in HAProxy's stick table and
compared with the limits the sync writes into maps; over one, the answer is 429 with Retry-After
and an OpenAI-shaped error naming the limit. Changed limits apply after one sync pass, no restart.
"""

from __future__ import annotations

import concurrent.futures
import http.client
import json
import threading
import time

import pytest
import requests

from devstack.polling import wait_until
from gateway.models import ApiKey, Tenant
from inventory.models import Shard
from tests.test_gateway import CHAT, Engine, Gateway, serve

pytestmark = [pytest.mark.slow, pytest.mark.django_db]


@pytest.fixture
def tenant(db) -> Tenant:
    return Tenant.objects.create(name="acme")


@pytest.fixture
def key(tenant) -> str:
    made = ApiKey(tenant=tenant)
    secret = made.issue()
    made.save()
    return secret


@pytest.fixture
def engine(gateway, db):
    """One demo engine behind the gateway; slow enough (20 ms a token) that streams stay in flight."""
    replica = serve("gw-1", 0)
    running = Engine(replica.deployment.engine_secret, cpu_ms_per_token=20)
    Shard.objects.filter(replica=replica).update(port=running.port)
    gateway.sync.run_once()
    yield running
    running.stop()


def limit(gateway: Gateway, tenant: Tenant, **limits) -> None:
    Tenant.objects.filter(pk=tenant.pk).update(**limits)
    gateway.sync.run_once()


def held_stream(gateway: Gateway, key: str, deadline: float = 0) -> http.client.HTTPConnection:
    """A stream open on its own connection, its first event read: in flight until the connection is closed.
    With a deadline, tried again until a slot is free (a 429 read and its connection closed each time)."""
    body = json.dumps({"model": "chat", "prompt": "x", "max_tokens": 500, "stream": True})
    until = time.monotonic() + deadline
    while True:
        connection = http.client.HTTPConnection("127.0.0.1", gateway.port, timeout=10)
        connection.request("POST", "/v1/completions", body, {"Authorization": f"Bearer {key}"})
        answer = connection.getresponse()
        if answer.status == 200:
            assert answer.readline().startswith(b"data: ")
            return connection
        answer.read()
        connection.close()
        assert time.monotonic() < until, f"no free slot: {answer.status}"


def refused_for(answer: requests.Response, what: str) -> bool:
    error = answer.json()["error"]
    return (
        answer.status_code == 429
        and answer.headers["Retry-After"] == "1"
        and error["code"] == "rate_limit_exceeded"
        and what in error["message"]
    )


def test_over_its_requests_per_second_a_tenant_gets_429_naming_the_limit_then_no_limit_after_a_pass(
    gateway, engine, tenant, key
):
    limit(gateway, tenant, requests_per_second=3)
    # Six at once (so within one second however loaded the machine): the limit's three pass, the rest are
    # refused and reach no engine.
    with concurrent.futures.ThreadPoolExecutor(6) as pool:
        answers = list(pool.map(lambda _: gateway.post("/v1/chat/completions", CHAT, key), range(6)))
    codes = [a.status_code for a in answers]
    assert codes.count(200) == 3 and codes.count(429) == 3, codes
    assert engine.tokens_generated() == 3 * CHAT["max_tokens"]
    assert all(refused_for(a, "requests per second limit of 3") for a in answers if a.status_code == 429)
    limit(gateway, tenant, requests_per_second=None)
    assert all(gateway.post("/v1/chat/completions", CHAT, key).status_code == 200 for _ in range(6))


def test_a_refused_request_does_not_count_so_the_limits_worth_passes_each_second(gateway, engine, tenant, key):
    limit(gateway, tenant, requests_per_second=2)
    admitted = 0
    with requests.Session() as session:
        session.headers["Authorization"] = f"Bearer {key}"
        for _ in range(40):
            admitted += session.get(gateway.url("/v1/models"), timeout=10).status_code == 200
    # Forty refusals in a burst do not lock the tenant out: within three seconds a request passes again.
    wait_until(lambda: gateway.post("/v1/chat/completions", CHAT, key).status_code == 200, 3, "the rate to fall")
    assert admitted == 2


def test_a_zero_limit_refuses_every_request(gateway, engine, tenant, key):
    limit(gateway, tenant, requests_per_second=0)
    assert refused_for(gateway.post("/v1/chat/completions", CHAT, key), "requests per second limit of 0")


def test_over_its_concurrent_requests_a_tenant_gets_429_while_kept_alive_idle_connections_count_none(
    gateway, engine, tenant, key
):
    limit(gateway, tenant, concurrent_requests=2)
    # A kept-alive connection between requests is not a request in flight: one after another, all pass.
    with requests.Session() as session:
        session.headers["Authorization"] = f"Bearer {key}"
        assert [session.get(gateway.url("/v1/models"), timeout=10).status_code for _ in range(5)] == [200] * 5
        streams = [held_stream(gateway, key) for _ in range(2)]
        third = gateway.post("/v1/chat/completions", CHAT, key)
        assert refused_for(third, "concurrent requests limit of 2")
        # The idle kept-alive session's connection is still open, and counts for nothing.
        # A stream the client closes leaves the count at once: its slot is free for the next request,
        # and only its slot: the other stream still counts.
        streams[0].close()
        streams[0] = held_stream(gateway, key, deadline=5)
        assert refused_for(gateway.post("/v1/chat/completions", CHAT, key), "concurrent requests limit of 2")
        for stream in streams:
            stream.close()


def test_another_tenants_limit_is_not_mine(gateway, engine, tenant, key):
    other = Tenant.objects.create(name="other", requests_per_second=0)
    gateway.sync.run_once()
    assert gateway.post("/v1/chat/completions", CHAT, key).status_code == 200
    other_key = ApiKey(tenant=other)
    secret = other_key.issue()
    other_key.save()
    gateway.sync.run_once()
    assert gateway.post("/v1/chat/completions", CHAT, secret).status_code == 429


def test_a_tenant_deleted_while_its_stream_is_in_flight_loses_its_keys_and_limits_and_the_stream_ends(
    gateway, engine, tenant, key
):
    limit(gateway, tenant, concurrent_requests=5)
    stream = gateway.post(
        "/v1/completions", {"model": "chat", "prompt": "x", "max_tokens": 50, "stream": True}, key, stream=True
    )
    ended = threading.Event()

    def read_to_the_end():
        if [line for line in stream.iter_lines() if line][-1] == b"data: [DONE]":
            ended.set()

    reader = threading.Thread(target=read_to_the_end)
    reader.start()
    tenant.delete()
    done = gateway.sync.run_once()
    assert any(action.startswith("del map concurrency.map") for action in done.actions), done.actions
    assert gateway.post("/v1/chat/completions", CHAT, key).status_code == 401
    reader.join(10)
    assert ended.is_set()
