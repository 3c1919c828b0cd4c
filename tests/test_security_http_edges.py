"""HTTP as clients really send it: bodies without a length, and HEAD probes.

A heartbeat sent with `Transfer-Encoding: chunked` was refused as truncated JSON,
because Django reads only Content-Length bytes; load balancers probe with HEAD,
which /healthz answered 405.
"""

from __future__ import annotations

import io
import subprocess
import sys
from pathlib import Path

import pytest
import requests

from agent import protocol
from devstack.polling import wait_until
from devstack.ports import free_port, port_open
from devstack.stack import web_server_command
from tests.agentapi import JOIN_TOKEN, a_load, register, register_over_http

ROOT = Path(__file__).resolve().parent.parent


def chunked_post(client, path: str, body: bytes, token: str, terminated: bool):
    """A POST as a WSGI server hands over a chunked body: no CONTENT_LENGTH, and the
    de-chunked body in wsgi.input, marked terminated when the server says so."""
    environ = {
        "CONTENT_TYPE": "application/json",
        "HTTP_TRANSFER_ENCODING": "chunked",
        "HTTP_AUTHORIZATION": f"Bearer {token}",
        "wsgi.input": io.BytesIO(body),
    }
    if terminated:
        environ["wsgi.input_terminated"] = True
    return client.generic("POST", path, **environ)


@pytest.fixture
def token(client, settings, redis_client):
    settings.LLMGW_JOIN_TOKEN = JOIN_TOKEN
    return register(client, "gpu-1")


@pytest.mark.django_db
def test_a_chunked_heartbeat_is_read_when_the_server_marks_its_end(client, token):
    body = protocol.encode(protocol.Heartbeat(load=a_load(33.0)))
    response = chunked_post(client, "/api/v1/heartbeat", body, token, terminated=True)
    assert response.status_code == 200, response.content
    assert protocol.decode(response.content, protocol.HeartbeatReply).state


@pytest.mark.django_db
def test_a_chunked_heartbeat_over_the_limit_is_refused_as_too_large(client, token):
    body = b'{"padding": "' + b"x" * protocol.MAX_BODY_BYTES + b'"}'
    response = chunked_post(client, "/api/v1/heartbeat", body, token, terminated=True)
    assert response.status_code == 413


@pytest.mark.django_db
def test_a_chunked_heartbeat_the_server_cannot_end_is_refused_naming_content_length(client, token):
    body = protocol.encode(protocol.Heartbeat(load=a_load()))
    response = chunked_post(client, "/api/v1/heartbeat", body, token, terminated=False)
    assert response.status_code == 411
    rejection = protocol.decode(response.content, protocol.Rejection)
    assert rejection.field == "Content-Length"
    assert "chunked" in rejection.reason


@pytest.mark.django_db
@pytest.mark.parametrize("path", ["/healthz", "/readyz"])
def test_head_is_answered_like_get(client, redis_client, path):
    got = client.get(path)
    head = client.head(path)
    assert head.status_code == got.status_code == 200
    assert head["Content-Type"] == got["Content-Type"]
    assert head.content == b""


def test_post_to_healthz_is_still_refused(client):
    assert client.post("/healthz").status_code == 405


@pytest.mark.slow
def test_the_real_web_server_reads_a_chunked_heartbeat_and_answers_head(tmp_path, redis_server):
    url = redis_server if isinstance(redis_server, str) else redis_server.url
    env = {
        "PATH": "/usr/bin:/bin",
        "DEBUG": "true",
        "LLMGW_VAR_DIR": str(tmp_path),
        "REDIS_URL": url,
        "LLMGW_JOIN_TOKEN": JOIN_TOKEN,
        # The suite's other tests register from 127.0.0.1 on the same Redis in the same minute,
        # under limits they raise in their own process (tests/conftest.py); so does this server.
        "LLMGW_REGISTER_PER_MINUTE": "1000000",
    }
    manage = [sys.executable, "manage.py", "migrate", "--verbosity", "0"]
    subprocess.run(manage, cwd=ROOT, env=env, check=True, timeout=120)
    port = free_port()
    command = web_server_command(port, 1)
    server = subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_until(lambda: port_open(port), 30, "the web server listening")
        base = f"http://127.0.0.1:{port}"
        head = requests.head(f"{base}/healthz", timeout=10)
        assert head.status_code == 200 and head.content == b""

        registration = protocol.Register(node_id="chunky-1", inventory=protocol.Inventory(hostname="chunky"))
        node_token = register_over_http(base, registration)

        body = protocol.encode(protocol.Heartbeat(load=a_load()))
        # A generator makes requests send the body chunked, with no Content-Length.
        chunks = (body[i : i + 100] for i in range(0, len(body), 100))
        response = requests.post(
            f"{base}/api/v1/heartbeat",
            data=chunks,
            headers={"Authorization": f"Bearer {node_token}", "Content-Type": "application/json"},
            timeout=10,
        )
        assert response.request.headers.get("Transfer-Encoding") == "chunked"
        assert response.status_code == 200, response.text
    finally:
        server.terminate()
        server.wait(10)
