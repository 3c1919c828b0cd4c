"""The proxy's limits, through the stack as `make run` starts it (HAProxy, one web worker behind it).

One worker makes a held worker visible: any request the proxy let through before it
was whole would keep every other request waiting.
"""

from __future__ import annotations

import contextlib
import json
import re
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
import requests

from agent import protocol
from devstack import proxy
from devstack.polling import wait_until
from devstack.ports import free_port
from devstack.stack import Stack, given_join_token
from livestate import keys, selfmetrics
from nodes.api import proxyclock
from tests.agentapi import register_over_http
from tests.factories import make_inventory

pytestmark = pytest.mark.slow

REGISTER_PER_MINUTE = 3
# deploy/haproxy.cfg's `timeout http-request`.
HTTP_REQUEST_TIMEOUT = 10.0


@pytest.fixture(scope="module")
def stack(tmp_path_factory, redis_server):
    var = tmp_path_factory.mktemp("proxy-limits")
    stack = Stack(
        var,
        env={
            "DATABASE_URL": f"sqlite:///{var / 'llmgw.sqlite3'}",
            "REDIS_URL": redis_server if isinstance(redis_server, str) else redis_server.url,
            "LLMGW_REGISTER_PER_MINUTE": str(REGISTER_PER_MINUTE),
            # Registrations below carry a wrong join token: refused credentials, counted per address.
            "LLMGW_AUTH_FAILURES_PER_MINUTE": str(REGISTER_PER_MINUTE),
            # Every heartbeat's wait in the proxy is noted, however short (no sweep runs here).
            "LLMGW_BEHIND_AFTER": "0",
        },
        web_port=free_port(),
        workers=1,
    )
    try:
        stack.manage("migrate", "--noinput", "-v0")
        stack.start_web()
        yield stack
    finally:
        stack.stop_all()


def exchange(port: int, head: bytes, body: bytes = b"", source: str = "127.0.0.1", timeout: float = 15) -> bytes:
    """Send raw bytes, read the whole answer (the proxy closes after it)."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout, source_address=(source, 0)) as sock:
        sock.sendall(head + body)
        chunks = []
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks)


def status_of(answer: bytes) -> int:
    return int(answer.split(b" ", 2)[1])


def test_a_body_over_512_kib_is_refused_by_the_proxy_naming_the_field(stack):
    head = (
        b"POST /api/v1/heartbeat HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\nConnection: close\r\n\r\n" % (protocol.MAX_BODY_BYTES + 1)
    )
    # Refused on the headers alone: no byte of the body is sent.
    answer = exchange(stack.web_port, head)
    assert status_of(answer) == 413
    body = answer.partition(b"\r\n\r\n")[2]
    assert json.loads(body) == {"field": "$", "reason": f"the body is larger than {protocol.MAX_BODY_BYTES} bytes"}


def test_a_whole_512_kib_body_sent_slowly_holds_no_worker(stack):
    base = f"http://127.0.0.1:{stack.web_port}"
    body = b'{"padding": "' + b"x" * (protocol.MAX_BODY_BYTES - 15) + b'"}'
    assert len(body) == protocol.MAX_BODY_BYTES
    head = (
        b"POST /api/v1/heartbeat HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer nobody.nothing\r\n"
        b"Content-Type: application/json\r\nContent-Length: %d\r\nConnection: close\r\n\r\n" % len(body)
    )
    answers: list[bytes] = []
    body_sent_at: list[float] = []
    pieces = 8

    def slow_sender() -> None:
        with socket.create_connection(("127.0.0.1", stack.web_port), timeout=20) as sock:
            sock.sendall(head)
            for i in range(pieces):
                if i:
                    time.sleep(0.5)  # the attack itself: a body trickling in, not synchronisation
                sock.sendall(body[i * len(body) // pieces : (i + 1) * len(body) // pieces])
            body_sent_at.append(time.monotonic())
            chunks = []
            while chunk := sock.recv(65536):
                chunks.append(chunk)
            answers.append(b"".join(chunks))

    sender = threading.Thread(target=slow_sender)
    sender.start()
    # The only worker answers others while the body trickles in: the proxy holds it, not the worker,
    # which would otherwise answer nothing else until the last piece came.
    answered_at = []
    while sender.is_alive():
        assert requests.get(f"{base}/healthz", timeout=10).status_code == 200
        answered_at.append(time.monotonic())
    sender.join()
    assert len([at for at in answered_at if at < body_sent_at[0]]) >= 3
    # Then passed on whole: the control plane itself answered (a wrong token), not the proxy.
    assert status_of(answers[0]) == 401, answers[0][:200]


def test_a_body_that_stops_coming_is_cut_by_the_proxy_and_holds_no_worker(stack):
    base = f"http://127.0.0.1:{stack.web_port}"
    head = (
        b"POST /api/v1/heartbeat HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        b"Content-Length: 1000\r\nConnection: close\r\n\r\n"
    )
    with socket.create_connection(("127.0.0.1", stack.web_port), timeout=20) as sock:
        opened = time.monotonic()
        sock.sendall(head + b'{"load": ')
        # The only worker is free meanwhile.
        assert requests.get(f"{base}/healthz", timeout=5).status_code == 200
        answer = sock.recv(65536)
        held = time.monotonic() - opened
    assert status_of(answer) == 408
    assert HTTP_REQUEST_TIMEOUT - 1 <= held <= HTTP_REQUEST_TIMEOUT + 4, held


def test_each_agent_address_is_limited_on_its_own_and_a_forged_forwarded_for_changes_nothing(stack):
    def register(source: str, forged: str) -> int:
        head = (
            b"POST /api/v1/register HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            b"Authorization: Bearer not-the-join-token\r\n"
            b"X-Forwarded-For: %s\r\nContent-Length: 2\r\nConnection: close\r\n\r\n" % forged.encode()
        )
        return status_of(exchange(stack.web_port, head, b"{}", source=source))

    # One client writing a new address each time is still counted as the address it comes from.
    first = [register("127.0.0.7", f"10.9.9.{i}") for i in range(REGISTER_PER_MINUTE + 1)]
    assert first[-1] == 429, first
    assert 429 not in first[:-1], first
    # Another agent's address has its own budget, though both reach the web server from the proxy.
    assert register("127.0.0.8", "127.0.0.7") != 429


def test_a_heartbeats_wait_is_the_proxys_own_measure_whatever_the_client_writes(stack):
    base = f"http://127.0.0.1:{stack.web_port}"
    message = protocol.Register(node_id="waits", inventory=make_inventory("waits.example"), inventory_hash="h")
    token = register_over_http(base, message, given_join_token(stack.env))
    store = redis.Redis.from_url(stack.env["REDIS_URL"])
    store.delete(keys.BEHIND_AT)
    # A client claiming its heartbeat reached the proxy in 1970: believed, the control plane would look
    # decades behind and the sweep would mark no node.
    forged = {"Authorization": f"Bearer {token}", "Content-Type": "application/json", "X-Request-Start": "t=1000000"}
    beat = protocol.encode(protocol.Heartbeat())
    with worker_held(stack):
        sent = time.time()
        answer = requests.post(f"{base}/api/v1/heartbeat", data=beat, headers=forged, timeout=10)
    assert answer.status_code == 200, answer.text
    noted_at, _, waited = store.get(keys.BEHIND_AT).partition(b" ")
    assert sent <= float(noted_at) <= time.time()
    assert 0 < float(waited) < time.time() - sent, "the wait is from the proxy's stamp, not the client's"


def test_a_body_sent_slowly_is_not_counted_as_a_wait_in_the_proxy(stack):
    """The stamp is taken once the body is in: a node trickling its body cannot make the control plane look behind."""
    message = protocol.Register(node_id="slow", inventory=make_inventory("slow.example"), inventory_hash="h")
    token = register_over_http(f"http://127.0.0.1:{stack.web_port}", message, given_join_token(stack.env))
    store = redis.Redis.from_url(stack.env["REDIS_URL"])
    store.delete(keys.BEHIND_AT)
    body = protocol.encode(protocol.Heartbeat())
    head = (
        b"POST /api/v1/heartbeat HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        b"Authorization: Bearer %s\r\nContent-Length: %d\r\nConnection: close\r\n\r\n" % (token.encode(), len(body))
    )
    with socket.create_connection(("127.0.0.1", stack.web_port), timeout=15) as sock:
        sock.sendall(head)
        time.sleep(1.5)  # the slow sender itself, not a wait for something
        with worker_held(stack):
            body_sent_at, body_sent = time.time(), time.monotonic()
            sock.sendall(body)
            answer = sock.recv(65536)
        answered_after = time.monotonic() - body_sent
    assert status_of(answer) == 200, answer
    noted_at, _, waited = store.get(keys.BEHIND_AT).partition(b" ")
    assert body_sent_at <= float(noted_at) <= time.time(), "noted for this heartbeat, not another"
    # The queue behind the held worker, not the 1.5 s the body took before it: that is the sender's.
    assert 0 < float(waited) < answered_after


@contextlib.contextmanager
def worker_held(stack: Stack) -> Iterator[None]:
    """The stack's only web worker busy until the block ends, so that a request sent in it queues in the proxy.

    Once the proxy's clock offset (learnt from its health checks) is taken off, a heartbeat that did not
    queue may show no wait at all, and then none is noted; one sent here waits for the worker, which is
    hashing a wrong admin password (Django's hasher, some half a second).
    """
    base = f"http://127.0.0.1:{stack.web_port}"
    session = requests.Session()
    page = session.get(f"{base}/admin/login/", timeout=10).text
    found = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page)
    assert found, page[:500]
    form = {"csrfmiddlewaretoken": found.group(1), "username": "nobody", "password": "wrong"}
    login = threading.Thread(target=session.post, args=(f"{base}/admin/login/",), kwargs={"data": form, "timeout": 10})
    login.start()
    try:
        wait_until(lambda: worker_busy(stack), 5, "the login to take the worker")
        yield
    finally:
        login.join()


def worker_busy(stack: Stack) -> bool:
    rows = proxy.stats(stack.stats_socket)
    return any(
        row["pxname"] == "web" and row["svname"] not in ("FRONTEND", "BACKEND") and row["scur"] == "1" for row in rows
    )


def test_the_proxys_health_checks_teach_the_web_worker_its_clock(stack):
    """deploy/haproxy.cfg stamps its checks and names itself; the worker keeps the offset for /metrics."""
    store = redis.Redis.from_url(stack.env["REDIS_URL"])
    proxy = socket.gethostname()  # HAProxy's %[hostname], on this same host as the web worker
    field = f"{selfmetrics.PROXY_CLOCK_OFFSET}{proxy}/{proxyclock._HOST}"
    wait_until(lambda: store.hget(keys.SELF_METRICS, field) is not None, 30, "a health check with the proxy's stamp")
    # One host, one clock: what is left is the hop and the check's own wait.
    assert 0 <= float(store.hget(keys.SELF_METRICS, field)) < 0.25


def test_the_proxy_runs_with_its_heaps_thresholds_fixed(stack):
    """Left to adapt, glibc grows and trims the heap for the proxy's large buffers on every request."""
    environ = Path(f"/proc/{stack.parts['proxy'].pid}/environ").read_bytes().split(b"\0")
    for name, value in proxy.HAPROXY_ENV.items():
        assert f"{name}={value}".encode() in environ
