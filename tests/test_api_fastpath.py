"""POST /api/v1/heartbeat skips the middleware that serves people; everything else still goes through it."""

from __future__ import annotations

import pytest

from agent import protocol
from tests.agentapi import JOIN_TOKEN, a_load, heartbeat, register, reply_of

pytestmark = [pytest.mark.django_db]

SPY = "tests.test_api_fastpath.Spy"


class Spy:
    """A middleware at the end of the chain: records every path that reached it."""

    seen: list[str] = []

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        Spy.seen.append(request.path)
        return self.get_response(request)


@pytest.fixture(autouse=True)
def _spy(settings, redis_client):
    settings.LLMGW_JOIN_TOKEN = JOIN_TOKEN
    settings.MIDDLEWARE = [*settings.MIDDLEWARE, SPY]
    Spy.seen = []


def test_a_heartbeat_reaches_its_view_without_the_rest_of_the_chain(client):
    token = register(client, "gpu-1")
    assert Spy.seen == ["/api/v1/register"], "registration goes through every middleware"
    response = heartbeat(client, token, protocol.Heartbeat(load=a_load()))
    assert reply_of(response).state == "ready"
    assert Spy.seen == ["/api/v1/register"]
    assert "Set-Cookie" not in response and "Vary" not in response


def test_a_refused_heartbeat_is_answered_by_its_view_too(client):
    response = heartbeat(client, "gpu-9." + "A" * 43, protocol.Heartbeat())
    assert response.status_code == 401
    assert protocol.decode(response.content, protocol.Rejection).field == "Authorization"
    assert Spy.seen == []


def test_the_security_middleware_still_applies_to_heartbeats(client):
    response = heartbeat(client, "gpu-9." + "A" * 43, protocol.Heartbeat())
    assert response["X-Content-Type-Options"] == "nosniff"
    assert response["X-Frame-Options"] == "DENY"


@pytest.mark.parametrize("path", ["/healthz", "/api/v1/heartbeat/", "/api/v1/heartbeats"])
def test_other_paths_go_through_the_whole_chain(client, path):
    client.post(path)
    assert Spy.seen == [path]
