"""The stream relay (deploy/gateway_relay.lua): a stream its engine cuts mid-way ends with an SSE error event
and a complete response; a whole stream comes through byte for byte; only streams take it; its routing
headers cannot be sent by a client.

A real HAProxy programmed by the real sync, in front of a real demo engine (killed with SIGKILL) or of a
scripted engine that sends chosen bytes in chosen chunks, read by a raw client that checks the chunked
framing itself (an HTTP library would hide a truncated response behind its own error).
"""

from __future__ import annotations

import json
import re
import socket
import threading
import time

import pytest

from agent import enginekinds
from devstack.polling import wait_until
from gateway.haproxy_config import RELAY_LUA
from gateway.runtime import ask
from inventory.models import Deployment, ReplicaState, Shard
from inventory.models import Engine as EngineKind
from tests.test_gateway import Engine, Gateway, serve

pytestmark = pytest.mark.slow

CUT_EVENT = {
    "error": {
        "message": "The model's engine stopped before the end of the answer",
        "type": "server_error",
        "param": None,
        "code": "upstream_disconnected",
    }
}


class ScriptedEngine(threading.Thread):
    """An engine answering every request with `chunks` as a chunked event stream, then its end (or, with
    `end=False`, a closed connection without it); it keeps each request's headers. It answers after `wait`
    seconds; its chunks go `gap` seconds apart, or with `gap=None` all in one write, as fast as a machine can."""

    def __init__(self, chunks: list[bytes], end: bool = True, gap: float | None = 0.005, wait: float = 0):
        super().__init__(daemon=True)
        self.chunks, self.end, self.gap, self.wait = chunks, end, gap, wait
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.heads: list[bytes] = []
        self.bodies: list[bytes] = []
        self.start()

    def run(self) -> None:
        while True:
            try:
                connection, _ = self.listener.accept()
            except OSError:
                return
            with connection:
                self.answer(connection)

    def answer(self, connection: socket.socket) -> None:
        received = b""
        while b"\r\n\r\n" not in received:
            more = connection.recv(65536)
            if not more:
                return
            received += more
        head, _, body = received.partition(b"\r\n\r\n")
        length = int(re.search(rb"(?im)^content-length: *(\d+)", head).group(1))
        while len(body) < length:
            body += connection.recv(65536)
        self.heads.append(head)
        self.bodies.append(body)
        time.sleep(self.wait)
        connection.sendall(
            b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n"
            b"Connection: close\r\n\r\n"
        )
        framed = [b"%x\r\n%s\r\n" % (len(chunk), chunk) for chunk in self.chunks]
        try:
            if self.gap is None:
                connection.sendall(b"".join(framed))
            else:
                for piece in framed:
                    connection.sendall(piece)
                    time.sleep(self.gap)
        except OSError:
            return  # the gateway ended the stream
        if self.end:
            connection.sendall(b"0\r\n\r\n")

    def stop(self) -> None:
        self.listener.close()


def scripted(gateway: Gateway, chunks: list[bytes], **answer) -> ScriptedEngine:
    made = ScriptedEngine(chunks, **answer)
    serve("gw-1", made.port)
    gateway.program()
    return made


def request_bytes(body: dict, key: str, extra: bytes = b"", raw: bytes | None = None) -> bytes:
    data = json.dumps(body).encode() if raw is None else raw
    return (
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: gateway\r\nConnection: close\r\n"
        b"Authorization: Bearer %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n%s\r\n%s"
    ) % (key.encode(), len(data), extra, data)


def dechunk(raw: bytes) -> tuple[int, bytes, bool]:
    """The status, the body, and whether the chunked body reached its end (the zero chunk and its blank line)."""
    head, _, rest = raw.partition(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    assert re.search(rb"(?im)^transfer-encoding: *chunked", head), head
    body = b""
    while True:
        line, found, rest = rest.partition(b"\r\n")
        if not found:
            return status, body, False
        size = int(line.split(b";")[0], 16)
        if size == 0:
            # No trailers, or trailers ended by a blank line.
            return status, body, rest == b"\r\n" or rest.endswith(b"\r\n\r\n")
        if len(rest) < size + 2:
            return status, body + rest[:size], False
        body, rest = body + rest[:size], rest[size + 2 :]


def read_to_end(connection: socket.socket, received: bytes = b"", deadline: float = 10) -> bytes:
    """All the gateway sends until it closes; a hang fails at the deadline."""
    connection.settimeout(deadline)
    while more := connection.recv(65536):
        received += more
    return received


def relayed(gateway: Gateway) -> int:
    """Requests the relay's internal frontend has taken (its `stot`)."""
    rows = ask(gateway.paths.admin_socket, "show stat").splitlines()
    fields = rows[0].lstrip("# ").split(",")
    for row in rows[1:]:
        values = dict(zip(fields, row.split(","), strict=False))
        if values.get("pxname") == "relay" and values.get("svname") == "FRONTEND":
            return int(values["stot"])
    raise AssertionError("no relay frontend in the gateway's stats")


STREAM = {"model": "chat", "messages": [{"role": "user", "content": "x"}], "stream": True, "max_tokens": 4096}


@pytest.mark.django_db
def test_a_stream_whose_engine_is_killed_ends_with_an_error_event_and_a_complete_response(gateway, key):
    replica = serve("gw-1", 0)
    # 4,096 tokens at 5 ms each: twenty seconds of stream, killed after a few events.
    running = Engine(replica.deployment.engine_secret, 5)
    try:
        Shard.objects.filter(replica=replica).update(port=running.port)
        gateway.program()
        connection = socket.create_connection(("127.0.0.1", gateway.port))
        connection.sendall(request_bytes(STREAM, key))
        received = b""
        connection.settimeout(10)
        while received.count(b"data: ") < 3:
            received += connection.recv(65536)
        running.stop()
        killed_at = time.monotonic()
        received = read_to_end(connection, received)
        ended_after = time.monotonic() - killed_at
        connection.close()
    finally:
        if running.process.poll() is None:
            running.stop()
    status, body, complete = dechunk(received)
    assert status == 200
    # Ended by the relay within a second of the kill, as a whole response: not a hang, not a truncation.
    assert complete, received[-200:]
    assert ended_after < 1.0
    events = [event for event in body.split(b"\n\n") if event]
    assert len(events) >= 4
    for event in events[:-1]:
        assert json.loads(event.removeprefix(b"data: "))["object"] == "chat.completion.chunk"
    assert json.loads(events[-1].removeprefix(b"data: ")) == CUT_EVENT
    assert body.endswith(b"\n\n")


@pytest.mark.django_db
def test_a_whole_stream_comes_through_byte_for_byte_whatever_its_chunks(gateway, key):
    # Events cut across chunks, several in one chunk, bytes outside ASCII, one event larger than a buffer.
    chunks = [
        b'data: {"a": 1}\n\ndata: {"b"',
        b': "\xc3\xa9\xe2\x82\xac"}\n\n',
        b'data: {"c": "' + b"x" * 400_000 + b'"}\n\n',
        b"data: [DONE]\n\n",
    ]
    scripted(gateway, chunks)
    connection = socket.create_connection(("127.0.0.1", gateway.port))
    connection.sendall(request_bytes(STREAM, key))
    answer = read_to_end(connection)
    status, body, complete = dechunk(answer)
    assert (status, complete) == (200, True)
    assert body == b"".join(chunks)
    assert relayed(gateway) == 1
    # The server the internal frontend names for the relay's count is not passed on.
    assert b"x-llmgw-" not in answer.partition(b"\r\n\r\n")[0].lower()


@pytest.mark.django_db
def test_a_stream_its_engine_ends_without_the_chunked_end_gets_the_error_event_after_a_blank_line(gateway, key):
    # The engine's connection closes after half an event: the error event still starts on its own.
    scripted(gateway, [b'data: {"a": 1}\n\n', b'data: {"b"'], end=False)
    connection = socket.create_connection(("127.0.0.1", gateway.port))
    connection.sendall(request_bytes(STREAM, key))
    status, body, complete = dechunk(read_to_end(connection))
    assert (status, complete) == (200, True)
    assert body == b'data: {"a": 1}\n\ndata: {"b"\n\n' + b"data: " + json.dumps(CUT_EVENT).encode() + b"\n\n"


@pytest.mark.django_db
def test_the_relay_asks_a_stream_for_the_running_usage_its_engine_kind_names_after_the_clients_members(gateway, key):
    engine = scripted(gateway, [b"data: [DONE]\n\n"])
    # A client that declined usage, its object spaced and ended by a newline.
    sent = b'{"model": "chat", "messages": [{"role": "user", "content": "x"}], "stream": true,'
    sent += b' "stream_options": {"include_usage": false}, "temperature": 0}\n'
    for kind in (EngineKind.VLLM, EngineKind.COMMAND):
        Deployment.objects.update(engine=kind)
        gateway.program()
        connection = socket.create_connection(("127.0.0.1", gateway.port))
        connection.sendall(request_bytes(json.loads(sent), key, raw=sent))
        assert dechunk(read_to_end(connection))[:2] == (200, b"data: [DONE]\n\n")
    to_vllm, to_command = engine.bodies
    # vLLM's running usage, in place of the client's stream_options; the client's other members as sent.
    asked = json.loads(to_vllm)
    assert asked["stream_options"] == json.loads("{" + enginekinds.get("vllm").running_usage + "}")["stream_options"]
    assert asked["stream_options"] == {"include_usage": True, "continuous_usage_stats": True}
    assert {k: v for k, v in asked.items() if k != "stream_options"} == {
        k: v for k, v in json.loads(sent).items() if k != "stream_options"
    }
    # A command engine's record names nothing: its stream goes as the client sent it.
    assert to_command == sent


@pytest.mark.django_db
def test_only_streams_go_through_the_relay(gateway, key):
    engine = scripted(gateway, [b"data: [DONE]\n\n"])
    for body in ({**STREAM, "stream": False}, {k: v for k, v in STREAM.items() if k != "stream"}):
        connection = socket.create_connection(("127.0.0.1", gateway.port))
        connection.sendall(request_bytes(body, key))
        answer = read_to_end(connection)
        assert answer.startswith(b"HTTP/1.1 200"), answer
    assert len(engine.heads) == 2, engine.heads
    assert relayed(gateway) == 0
    connection = socket.create_connection(("127.0.0.1", gateway.port))
    connection.sendall(request_bytes(STREAM, key))
    assert dechunk(read_to_end(connection))[:2] == (200, b"data: [DONE]\n\n")
    assert relayed(gateway) == 1


@pytest.mark.django_db
def test_a_client_cannot_send_the_relays_routing_headers(gateway, key):
    engine = scripted(gateway, [b"data: [DONE]\n\n"])
    spoofed = b"X-LLMGW-Backend: m_other\r\nX-LLMGW-Tenant: other\r\nX-LLMGW-Model: other\r\nx-llmgw-backend: m_x\r\n"
    connection = socket.create_connection(("127.0.0.1", gateway.port))
    connection.sendall(request_bytes(STREAM, key, spoofed))
    status, body, complete = dechunk(read_to_end(connection))
    # Routed by the body's model, as the tenant its key names.
    assert (status, body, complete) == (200, b"data: [DONE]\n\n", True)
    assert relayed(gateway) == 1
    headers = [line.lower() for line in engine.heads[0].split(b"\r\n")[1:]]
    assert [h for h in headers if h.startswith(b"x-llmgw-")] == [b"x-llmgw-tenant: acme"]


@pytest.mark.django_db
def test_a_stream_to_a_model_without_a_ready_replica_gets_the_backends_503_through_the_relay(gateway, key):
    engine = scripted(gateway, [b"data: [DONE]\n\n"])
    Shard.objects.update(state=ReplicaState.FAILED)
    gateway.program()
    connection = socket.create_connection(("127.0.0.1", gateway.port))
    connection.sendall(request_bytes(STREAM, key))
    answer = read_to_end(connection)
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 503")
    assert json.loads(body)["error"]["code"] == "no_ready_replica"
    assert (relayed(gateway), engine.heads) == (1, [])


STALLED_EVENT = {
    "error": {
        "message": "The gateway could not relay the rest of the answer: the client read it more slowly than the engine"
        " wrote it and fell too far behind",
        "type": "server_error",
        "param": None,
        "code": "relay_stalled",
    }
}


def events(count: int, size: int) -> list[bytes]:
    """`count` events of about `size` bytes each, then `[DONE]`."""
    return [b'data: {"n": %d, "pad": "%s"}\n\n' % (n, b"y" * size) for n in range(count)] + [b"data: [DONE]\n\n"]


@pytest.fixture
def small_gateway(tmp_path):
    # --max-body 16384: a 32 KiB buffer by the body's measure.
    made = Gateway(tmp_path / "gw-16k", max_body=16_384)
    yield made
    made.stop()


@pytest.mark.django_db
def test_an_answer_larger_than_a_small_bodys_buffer_arriving_at_once_comes_through_whole(small_gateway, key):
    # 38 KB of events in one write: with the buffer sized by --max-body alone (32 KiB), HAProxy read more than
    # its buffer at once and 2.6's Lua socket never read the rest (every stream hung ~1.6 KB short of its end).
    chunks = events(128, 280)
    scripted(small_gateway, chunks, gap=None)
    for _ in range(20):
        connection = socket.create_connection(("127.0.0.1", small_gateway.port))
        connection.sendall(request_bytes(STREAM, key))
        assert dechunk(read_to_end(connection, deadline=5)) == (200, b"".join(chunks), True)
        connection.close()


@pytest.mark.django_db
def test_a_client_that_falls_a_buffer_behind_its_stream_gets_an_error_event_not_a_hang(gateway, key):
    # 20 MB of events at once, to a client that stops reading for a moment (its window a few KB): the relay
    # falls a whole buffer behind, which 2.6's Lua socket cannot recover from. The client reads on and gets
    # what was relayed, then the error event, then the response's end.
    chunks = events(20_000, 1000)
    scripted(gateway, chunks, gap=None)
    connection = socket.socket()
    connection.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    connection.connect(("127.0.0.1", gateway.port))
    connection.sendall(request_bytes(STREAM, key))
    received = connection.recv(4096)
    time.sleep(1)  # the client's pause, which lets the engine's 20 MB pile up in front of it
    status, body, complete = dechunk(read_to_end(connection, received, deadline=15))
    assert (status, complete) == (200, True)
    relayed_part, _, last = body.rpartition(b"data: ")
    assert json.loads(last) == STALLED_EVENT
    # What came before it is the engine's stream as it began, not all of it, up to where the relay's last
    # read ended (a cut event is sent as far as it came, and the error event starts after a blank line).
    whole = b"".join(chunks)
    assert relayed_part.endswith(b"\n\n")
    sent = relayed_part if whole.startswith(relayed_part) else relayed_part.removesuffix(b"\n\n")
    assert whole.startswith(sent)
    assert 0 < len(sent) < len(whole)
    # And the gateway's log says so, for the operator.
    wait_until(
        lambda: (
            "ended a stream its client had fallen a buffer behind (tenant acme, model chat"
            in gateway.output.read_text(errors="replace")
        ),
        5,
        "the relay's warning in the gateway's log",
    )


@pytest.mark.django_db
def test_the_watchdogs_probe_is_ignored_by_a_hop_whose_engine_is_silent(gateway, key):
    # The probe the relay's watchdog sends a hop it suspects has ended, sent here to a live one: on the
    # relay's own socket, after a request as the relay writes it, while the engine says nothing for longer
    # than the hop's `timeout client` (before its answer, and between its events). The hop carries on.
    written = re.search(r'local PROBE = "(.*)"', RELAY_LUA.read_text()).group(1)
    probe = written.encode().decode("unicode_escape").encode()
    chunks = events(2, 10)
    engine = scripted(gateway, chunks, gap=3, wait=3)
    body = json.dumps(STREAM).encode()
    hop = socket.socket(socket.AF_UNIX)
    hop.connect(str(gateway.paths.relay_socket))
    hop.sendall(
        b"POST /v1/chat/completions HTTP/1.1\r\nhost: gateway\r\ncontent-type: application/json\r\n"
        b"x-llmgw-backend: m_chat\r\nx-llmgw-tenant: acme\r\nx-llmgw-model: chat\r\n"
        b"content-length: %d\r\nconnection: close\r\n\r\n%s" % (len(body), body)
    )
    for _ in range(4):
        time.sleep(1)  # the engine's silence, probed each second as the watchdog would
        hop.sendall(probe)
    # The hop closes after its answer; a probe it had not read by then makes that close a reset (a unix
    # socket closed with data unread), which comes after the whole answer, as the relay reads it.
    hop.settimeout(15)
    received = b""
    try:
        while more := hop.recv(65536):
            received += more
    except ConnectionResetError:
        pass
    status, relayed_body, complete = dechunk(received)
    assert (status, relayed_body, complete) == (200, b"".join(chunks), True)
    assert len(engine.bodies) == 1
