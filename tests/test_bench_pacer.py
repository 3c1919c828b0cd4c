"""The benchmark's open-loop fleet: every slot is counted, answered, failed or unsent, never skipped."""

from __future__ import annotations

import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from bench.fleetlib import pacer
from bench.fleetlib.pacer import HEARTBEAT, PacedFleet, Phase, request_tail

NODES = 20
INTERVAL = 0.2
SECONDS = 2.0


class _Ok(BaseHTTPRequestHandler):
    def do_POST(self):
        self.rfile.read(int(self.headers["Content-Length"]))
        self.send_response(200)
        self.send_header("Content-Length", "2")
        self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(b"{}")

    def log_message(self, *args):
        pass


@pytest.fixture
def answering():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Ok)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server.server_port
    server.shutdown()
    server.server_close()


@pytest.fixture
def silent():
    """A port that accepts connections into its backlog and never reads them."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(1024)
        yield listener.getsockname()[1]


def fleet_at(port: int) -> PacedFleet:
    tails = [request_tail("127.0.0.1", port, f"node-{i}.secret", b"{}") for i in range(NODES)]
    return PacedFleet("127.0.0.1", port, tails, INTERVAL, workers=1)


def test_every_node_beats_at_its_interval_and_each_answer_is_counted(answering):
    fleet = fleet_at(answering)
    try:
        fleet.start(Phase("measured", HEARTBEAT, INTERVAL, SECONDS))
        stats = fleet.collect("measured")
    finally:
        fleet.close()
    expected = NODES * SECONDS / INTERVAL
    assert 0.8 * expected <= stats.offered <= 1.2 * expected
    assert stats.answered == stats.offered == len(stats.latencies)
    assert stats.nodes == set(range(NODES))
    assert stats.unsent == 0 and not stats.errors
    assert stats.statuses == {200: stats.offered}


def test_slots_that_cannot_be_sent_are_counted_unsent(silent, monkeypatch):
    # Forked into the generator process, these hold there too.
    monkeypatch.setattr(pacer, "MAX_IN_FLIGHT", 5)
    monkeypatch.setattr(pacer, "TIMEOUT", 0.5)
    fleet = fleet_at(silent)
    try:
        fleet.start(Phase("measured", HEARTBEAT, INTERVAL, SECONDS))
        stats = fleet.collect("measured")
    finally:
        fleet.close()
    assert stats.answered == 0
    assert stats.unsent > 0
    sent = stats.offered - stats.unsent
    assert sum(stats.errors.values()) == sent, "every beat sent was answered or failed"
    assert set(stats.errors) <= {"timeout", "TimeoutError"}
