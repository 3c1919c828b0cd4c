"""What a request must show before anything is served (nodes/entry.py; issue 22, items 3 and 8).

Item 3: behind a proxy that says `X-Forwarded-Proto: http`, a request carrying a
token over plain HTTP was served (the APIs are exempt from the HTTPS redirect,
and a redirect would come after the secret had crossed anyway). Item 8: the
heartbeat's fast path answered any `Host`, and a registration's DisallowedHost
was an HTML page, not the protocol's JSON.
"""

from __future__ import annotations

import json

import pytest
from django.core.handlers.wsgi import WSGIHandler
from django.test import Client

from agent import protocol
from bench.fleetlib.profile import Started
from bench.fleetlib.profile import environ as wsgi_environ
from nodes.api import fastpath
from nodes.entry import HTTPS_REQUIRED
from tests.agentapi import JOIN_TOKEN, a_load, register
from tests.factories import make_inventory
from tests.opsapi_support import API, make_token

pytestmark = pytest.mark.django_db

EVIL = "evil.attacker.example"


@pytest.fixture(autouse=True)
def _behind_a_proxy_in_production(settings, redis_client, monkeypatch):
    settings.LLMGW_JOIN_TOKEN = JOIN_TOKEN
    settings.LLMGW_REQUIRE_HTTPS = True
    settings.LLMGW_PLAIN_HTTP_FROM_LOOPBACK = False
    settings.LLMGW_PROXY_HOPS = 1
    settings.ALLOWED_HOSTS = ["llmgw.example.com", "testserver"]
    # As Django's test client does for its own requests: the test's transaction owns the connection.
    monkeypatch.setattr(fastpath, "close_old_connections", lambda: None)


def over_wsgi(path: str, token: str, body: bytes = b"", host: str = "llmgw.example.com", **meta) -> tuple[int, dict]:
    """The WSGI application as a web server calls it, heartbeat fast path included."""
    environ = wsgi_environ(path, token, body, HTTP_HOST=host, HTTP_X_FORWARDED_FOR="192.0.2.7", **meta)
    started = Started()
    chunks = fastpath.HeartbeatFastPath(WSGIHandler())(environ, started)
    return int(started.answers[0][0].split()[0]), json.loads(b"".join(chunks))


@pytest.fixture
def https():
    """A client behind the proxy, over HTTPS."""
    return Client(HTTP_X_FORWARDED_PROTO="https")


def a_registration(node_id: str) -> bytes:
    return protocol.encode(protocol.Register(node_id=node_id, inventory=make_inventory(node_id), inventory_hash="h"))


def a_beat() -> bytes:
    return protocol.encode(protocol.Heartbeat(load=a_load()))


# -- item 3: a credential over plain HTTP --------------------------------------------------------


def test_an_operators_token_over_plain_http_is_refused_and_nothing_served(client, viewer):
    _, secret = make_token(viewer)
    response = client.get(
        f"{API}/me/",
        HTTP_AUTHORIZATION=f"Bearer {secret}",
        HTTP_X_FORWARDED_PROTO="http",
        HTTP_HOST="llmgw.example.com",
    )
    assert response.status_code == 403
    assert response.json()["error"] == HTTPS_REQUIRED
    assert "viewer" not in response.content.decode()


def test_the_same_token_over_https_is_served(client, viewer):
    _, secret = make_token(viewer)
    response = client.get(f"{API}/me/", HTTP_AUTHORIZATION=f"Bearer {secret}", HTTP_X_FORWARDED_PROTO="https")
    assert response.status_code == 200
    assert response.json()["user"] == "viewer"


def test_a_heartbeat_over_plain_http_is_refused_on_the_fast_path(https):
    token = register(https, "gpu-1")
    status, body = over_wsgi("/api/v1/heartbeat", token, a_beat(), HTTP_X_FORWARDED_PROTO="http")
    assert (status, body["field"], body["reason"]) == (403, "Authorization", HTTPS_REQUIRED)
    assert over_wsgi("/api/v1/heartbeat", token, a_beat(), HTTP_X_FORWARDED_PROTO="https")[0] == 200


def test_a_registration_and_the_metrics_token_over_plain_http_are_refused(settings):
    body = a_registration("gpu-1")
    assert over_wsgi("/api/v1/register", JOIN_TOKEN, body, HTTP_X_FORWARDED_PROTO="http")[0] == 403
    settings.LLMGW_METRICS_TOKEN = "metrics-secret"
    assert over_wsgi("/metrics", "metrics-secret", method="GET", HTTP_X_FORWARDED_PROTO="http")[0] == 403


def test_loopback_may_use_plain_http_where_the_settings_say_so(client, viewer, settings):
    _, secret = make_token(viewer)
    plain = {"HTTP_AUTHORIZATION": f"Bearer {secret}", "HTTP_X_FORWARDED_PROTO": "http"}
    assert client.get(f"{API}/me/", HTTP_X_FORWARDED_FOR="127.0.0.1", **plain).status_code == 403
    settings.LLMGW_PLAIN_HTTP_FROM_LOOPBACK = True
    assert client.get(f"{API}/me/", HTTP_X_FORWARDED_FOR="127.0.0.1", **plain).status_code == 200
    assert client.get(f"{API}/me/", HTTP_X_FORWARDED_FOR="192.0.2.7", **plain).status_code == 403


def test_development_settings_serve_plain_http(client, viewer, settings):
    settings.LLMGW_REQUIRE_HTTPS = False
    _, secret = make_token(viewer)
    response = client.get(f"{API}/me/", HTTP_AUTHORIZATION=f"Bearer {secret}", HTTP_X_FORWARDED_PROTO="http")
    assert response.status_code == 200


# -- item 8: the Host ----------------------------------------------------------------------------


def test_a_heartbeat_for_another_host_is_refused_on_the_fast_path(https):
    token = register(https, "gpu-1")
    status, body = over_wsgi("/api/v1/heartbeat", token, a_beat(), host=EVIL, HTTP_X_FORWARDED_PROTO="https")
    assert (status, body["field"]) == (400, "Host")


def test_a_registration_for_another_host_is_refused_in_the_protocols_json():
    body = a_registration("gpu-1")
    status, answer = over_wsgi("/api/v1/register", JOIN_TOKEN, body, host=EVIL, HTTP_X_FORWARDED_PROTO="https")
    assert status == 400
    assert protocol.decode(json.dumps(answer).encode(), protocol.Rejection).field == "Host"


def test_a_suffix_pattern_in_allowed_hosts_admits_its_subdomains(settings):
    settings.ALLOWED_HOSTS = [".example.com"]
    token = register(Client(HTTP_X_FORWARDED_PROTO="https", HTTP_HOST="cp.example.com"), "gpu-1")
    beat = over_wsgi("/api/v1/heartbeat", token, a_beat(), host="cp.example.com:443", HTTP_X_FORWARDED_PROTO="https")
    assert beat[0] == 200
