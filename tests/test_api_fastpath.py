"""POST /api/v1/heartbeat is answered by the WSGI application before Django's handler; the answer is the view's."""

from __future__ import annotations

import io

import pytest
from django.core.handlers.wsgi import WSGIHandler

from agent import protocol
from bench.fleetlib.profile import Started
from bench.fleetlib.profile import environ as wsgi_environ
from llmgw_site import wsgi
from nodes.api import fastpath
from tests.agentapi import JOIN_TOKEN, a_load, heartbeat, register, reply_of

pytestmark = [pytest.mark.django_db]

SPY = "tests.test_api_fastpath.Spy"
PATH = "/api/v1/heartbeat"


class Spy:
    """A middleware at the start of Django's chain: records every path that reached Django."""

    seen: list[str] = []

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        Spy.seen.append(request.path)
        return self.get_response(request)


class WsgiAnswer:
    """What a WSGI server would send: the status, the headers and the body."""

    def __init__(self, status: str, headers: list[tuple[str, str]], body: bytes):
        self.status_code = int(status.split(" ", 1)[0])
        self.status = status
        self.headers = dict(headers)
        self.content = body

    def __getitem__(self, name: str) -> str:
        return self.headers[name]

    def __contains__(self, name: str) -> bool:
        return name in self.headers


def call(path: str, body: bytes = b"", method: str = "POST", **meta) -> WsgiAnswer:
    """`application` called as a WSGI server calls it."""
    environ = wsgi_environ(path, None, body, method, HTTP_HOST="testserver", SERVER_NAME="testserver", **meta)
    started = Started()
    # Made afresh, so that Django's handler loads the middleware of this test's settings.
    application = fastpath.HeartbeatFastPath(WSGIHandler())
    chunks = application(environ, started)
    body_out = b"".join(chunks)
    if hasattr(chunks, "close"):
        chunks.close()
    return WsgiAnswer(*started.answers[0], body_out)


def beat_over_wsgi(token: str, beat: protocol.Heartbeat | bytes, **meta) -> WsgiAnswer:
    body = beat if isinstance(beat, bytes) else protocol.encode(beat)
    return call(PATH, body, HTTP_AUTHORIZATION=f"Bearer {token}", **meta)


@pytest.fixture(autouse=True)
def _spy(settings, redis_client, monkeypatch):
    settings.LLMGW_JOIN_TOKEN = JOIN_TOKEN
    settings.MIDDLEWARE = [SPY, *settings.MIDDLEWARE]
    Spy.seen = []
    # As Django's test client does for its own requests: the test's transaction owns the connection.
    monkeypatch.setattr(fastpath, "close_old_connections", lambda: None)
    # Read from settings once per process; these tests change the settings.
    fastpath.redirects_to_https.cache_clear()
    yield
    fastpath.redirects_to_https.cache_clear()


def test_the_wsgi_application_is_the_fast_path_in_front_of_django():
    assert isinstance(wsgi.application, fastpath.HeartbeatFastPath)
    assert isinstance(wsgi.application.application, WSGIHandler)


def test_a_heartbeat_is_answered_without_reaching_django(client):
    token = register(client, "gpu-1")
    assert Spy.seen == ["/api/v1/register"], "registration goes through Django"
    answer = beat_over_wsgi(token, protocol.Heartbeat(load=a_load()))
    assert answer.status == "200 OK"
    assert protocol.decode(answer.content, protocol.HeartbeatReply).state == "ready"
    assert answer["Content-Type"] == "application/json"
    assert int(answer["Content-Length"]) == len(answer.content)
    assert Spy.seen == ["/api/v1/register"]
    assert "Set-Cookie" not in answer and "Vary" not in answer


def test_the_answer_is_the_django_views_for_every_kind_of_request(client):
    """The same requests through the fast path and through Django's view of the heartbeat: the same answers."""
    token = register(client, "gpu-1")
    beat = protocol.encode(protocol.Heartbeat(load=a_load()))
    cases = [
        ("a good beat", {"token": token, "body": beat}),
        ("no token", {"token": None, "body": beat}),
        ("a wrong secret", {"token": token[:-4] + "AAAA", "body": beat}),
        ("not a node token", {"token": "nonsense", "body": beat}),
        ("malformed", {"token": token, "body": b'{"load": {"cpu_percent": "high"}}'}),
        ("not JSON at all", {"token": token, "body": b"\x00\x01"}),
        ("text/plain", {"token": token, "body": beat, "content_type": "text/plain"}),
        ("GET", {"token": token, "body": b"", "method": "GET"}),
    ]
    for name, case in cases:
        headers = {"HTTP_AUTHORIZATION": f"Bearer {case['token']}"} if case["token"] else {}
        content_type = case.get("content_type", "application/json")
        method = case.get("method", "POST")
        fast = call(PATH, case["body"], method=method, CONTENT_TYPE=content_type, **headers)
        viewed = client.generic(method, PATH, case["body"], content_type=content_type, **headers)
        assert fast.status_code == viewed.status_code, name
        if name != "a good beat":
            assert fast.content == viewed.content, name
            assert fast.headers.get("WWW-Authenticate") == viewed.headers.get("WWW-Authenticate"), name
    assert all(path == "/api/v1/register" or path == PATH for path in Spy.seen)
    assert Spy.seen.count(PATH) == len(cases), "each Django call went through Django, no fast call did"


def test_a_body_over_its_length_is_not_read_past_it(client):
    token = register(client, "gpu-1")
    beat = protocol.encode(protocol.Heartbeat(load=a_load()))
    stream = io.BytesIO(beat + b"GARBAGE AFTER THE BODY")
    answer = call(PATH, HTTP_AUTHORIZATION=f"Bearer {token}", CONTENT_LENGTH=str(len(beat)), **{"wsgi.input": stream})
    assert answer.status_code == 200, answer.content
    assert stream.read() == b"GARBAGE AFTER THE BODY"


def test_the_security_headers_are_djangos(client, settings):
    answer = call(PATH, b"{}", HTTP_AUTHORIZATION="Bearer gpu-9." + "A" * 43)
    viewed = client.post(PATH, b"{}", content_type="application/json", HTTP_AUTHORIZATION="Bearer gpu-9." + "A" * 43)
    for name in ("X-Content-Type-Options", "X-Frame-Options", "Referrer-Policy", "Cross-Origin-Opener-Policy"):
        assert answer[name] == viewed[name], name
    assert "Strict-Transport-Security" not in answer, "HSTS only over HTTPS"


def test_hsts_over_https_behind_the_proxy(settings):
    settings.SECURE_HSTS_SECONDS = 3600
    fastpath.hsts_header.cache_clear()
    try:
        answer = call(PATH, b"{}", HTTP_X_FORWARDED_PROTO="https")
    finally:
        fastpath.hsts_header.cache_clear()
    assert answer["Strict-Transport-Security"] == "max-age=3600"


def test_https_is_required_of_a_heartbeat_exactly_where_django_would_require_it(settings):
    settings.SECURE_SSL_REDIRECT = True
    fastpath.redirects_to_https.cache_clear()
    assert call(PATH, b"{}").status_code == 401, "the agent API is exempt (SECURE_REDIRECT_EXEMPT)"
    assert Spy.seen == []
    settings.SECURE_REDIRECT_EXEMPT = []
    fastpath.redirects_to_https.cache_clear()
    answer = call(PATH, b"{}")
    assert answer.status_code == 301
    assert answer["Location"] == "https://testserver/api/v1/heartbeat"
    assert Spy.seen == [PATH]
    assert call(PATH, b"{}", HTTP_X_FORWARDED_PROTO="https").status_code == 401


def test_a_failure_inside_is_a_logged_500_with_a_json_body(client, monkeypatch, caplog):
    def broken(meta, read):
        raise RuntimeError("a bug")

    monkeypatch.setattr(fastpath, "answer_heartbeat", broken)
    answer = call(PATH, b"{}")
    assert answer.status_code == 500
    assert protocol.decode(answer.content, protocol.Rejection).field == "$"
    assert any(record.exc_info and "a bug" in str(record.exc_info[1]) for record in caplog.records)


def test_a_database_connection_is_checked_after_each_heartbeat(monkeypatch):
    checks = []
    monkeypatch.setattr(fastpath, "close_old_connections", lambda: checks.append(1))
    call(PATH, b"{}")
    assert checks == [1]


@pytest.mark.parametrize("path", ["/healthz", "/api/v1/heartbeat/", "/api/v1/heartbeats"])
def test_other_paths_go_to_django(path):
    call(path, b"{}")
    assert Spy.seen == [path]


def test_the_django_view_of_the_heartbeat_still_answers(client):
    token = register(client, "gpu-1")
    assert reply_of(heartbeat(client, token, protocol.Heartbeat(load=a_load()))).state == "ready"
