"""A small stand-in control plane over real HTTP, speaking agent/protocol.py, that can fail on demand."""

from __future__ import annotations

import secrets
import threading
from collections import deque
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import msgspec

from agent import protocol


class FakeControlPlane:
    """Modes for heartbeats: ok, fail (500), hang (no answer until released), reject (400 with a Rejection)."""

    def __init__(self, join_token: str = "join-secret", interval: float = 0.05):
        self.join_token = join_token
        self.interval = interval
        self.mode = "ok"
        self.shards: list[protocol.ShardSpec] | None = None
        self.engines: list[protocol.EngineWant] | None = None
        self.inventory_wanted = False
        self.tokens: dict[str, str] = {}  # node token -> node id
        # Bounded, so a long failing run measures the agent's memory and not ours.
        self.heartbeats: deque[protocol.Heartbeat] = deque(maxlen=100)
        self.registrations: deque[protocol.Register] = deque(maxlen=100)
        self.attempts = 0
        self.released = threading.Event()
        self.lock = threading.Lock()
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_port}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> FakeControlPlane:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.released.set()
        self.server.shutdown()
        self.server.server_close()

    def accepted(self) -> int:
        with self.lock:
            return len(self.heartbeats)

    def accepted_more_than(self, seen: int) -> bool:
        """Whether a heartbeat arrived since `accepted()` said `seen`: wait_until(partial(this, seen))."""
        return self.accepted() > seen

    def _handler(self):
        plane = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            # Headers and body go out in two writes; without this, delayed ACKs cost 40 ms a reply.
            disable_nagle_algorithm = True

            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                bearer = self.headers.get("Authorization", "").removeprefix("Bearer ")
                if self.path == "/api/v1/register":
                    self.register(bearer, body)
                elif self.path == "/api/v1/heartbeat":
                    self.heartbeat(bearer, body)
                else:
                    self.reply(404, protocol.Rejection(field="path", reason="not found"))

            def register(self, bearer, body):
                if bearer != plane.join_token:
                    self.reply(401, protocol.Rejection(field="Authorization", reason="unknown join token"))
                    return
                message = protocol.decode(body, protocol.Register)
                token = secrets.token_hex(8)
                with plane.lock:
                    plane.registrations.append(message)
                    plane.tokens[token] = message.node_id
                self.reply(
                    201, protocol.Registered(node_id=message.node_id, token=token, heartbeat_interval=plane.interval)
                )

            def heartbeat(self, bearer, body):
                with plane.lock:
                    plane.attempts += 1
                    mode = plane.mode
                if mode == "fail":
                    self.reply(503, protocol.Rejection(field="", reason="unavailable"))
                    return
                if mode == "hang":
                    plane.released.wait(10)
                    self.reply(503, protocol.Rejection(field="", reason="was hung"))
                    return
                if mode == "reject":
                    self.reply(400, protocol.Rejection(field="load.cpu_percent", reason="must be at most 100"))
                    return
                if bearer not in plane.tokens:
                    self.reply(401, protocol.Rejection(field="Authorization", reason="unknown node token"))
                    return
                try:
                    message = protocol.decode(body, protocol.Heartbeat)
                except msgspec.ValidationError as exc:
                    self.reply(400, protocol.Rejection(field="body", reason=str(exc)))
                    return
                with plane.lock:
                    plane.heartbeats.append(message)
                self.reply(
                    200,
                    protocol.HeartbeatReply(
                        state="ready",
                        heartbeat_interval=plane.interval,
                        inventory_wanted=plane.inventory_wanted,
                        shards=plane.shards,
                        engines=plane.engines,
                    ),
                )

            def reply(self, status, message):
                data = protocol.encode(message)
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except OSError:
                    pass  # the agent gave up waiting (its read timeout): expected in the hang mode

            def log_message(self, format, *args):
                pass

        return Handler
