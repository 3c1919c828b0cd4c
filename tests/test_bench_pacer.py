"""The benchmark's open-loop fleet: every slot is counted, answered, failed or unsent, never skipped."""

from __future__ import annotations

import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from bench.fleetlib import pacer
from bench.fleetlib.pacer import HEARTBEAT, PacedFleet, Phase, fleet_tails, request_tail

NODES = 20
INTERVAL = 0.2
SECONDS = 2.0


class _Ok(BaseHTTPRequestHandler):
    """Answers each request and closes the connection, as gunicorn's sync workers did."""

    def do_POST(self):
        self.rfile.read(int(self.headers["Content-Length"]))
        self.send_response(200)
        self.send_header("Content-Length", "2")
        if self.protocol_version != "HTTP/1.1":
            self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(b"{}")

    def log_message(self, *args):
        pass


class _KeepsAlive(_Ok):
    """Answers on the same connection as long as the client keeps it, counting the connections it accepts."""

    protocol_version = "HTTP/1.1"
    connections = 0
    lock = threading.Lock()

    def setup(self):
        super().setup()
        with _KeepsAlive.lock:
            _KeepsAlive.connections += 1


def serve(handler):
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


@pytest.fixture
def answering():
    server = serve(_Ok)
    yield server.server_port
    server.shutdown()
    server.server_close()


@pytest.fixture
def keeping_alive():
    _KeepsAlive.connections = 0
    server = serve(_KeepsAlive)
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


def fleet_at(port: int, keep_alive: bool = False) -> PacedFleet:
    tails = [request_tail("127.0.0.1", port, f"node-{i}.secret", b"{}", keep_alive) for i in range(NODES)]
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


def test_each_node_keeps_its_connection_between_beats_as_the_agent_does(keeping_alive):
    fleet = fleet_at(keeping_alive, keep_alive=True)
    try:
        fleet.start(Phase("measured", HEARTBEAT, INTERVAL, SECONDS))
        stats = fleet.collect("measured")
    finally:
        fleet.close()
    assert stats.answered == stats.offered > 3 * NODES
    assert stats.nodes == set(range(NODES))
    # One connection per node, whatever the number of beats (a few more if a beat fell due while
    # the node's previous one was still being answered).
    assert NODES <= _KeepsAlive.connections <= NODES + 5, _KeepsAlive.connections


def test_a_proxy_short_of_descriptors_keeps_as_many_connections_as_leave_it_room():
    nodes = [(f"node-{i}.secret", b"{}") for i in range(NODES)]
    tails = fleet_tails("127.0.0.1", 8000, nodes, proxy_connections=pacer.ROOM + 12)
    closing = [index for index, tail in enumerate(tails) if b"\r\nConnection: close\r\n" in tail]
    assert closing == list(range(12, NODES)), "the first nodes keep theirs, the rest connect each beat"
    assert all(tail.endswith(b"\r\n\r\n{}") for tail in tails)


def test_a_silent_phase_sends_nothing_and_the_fleet_resumes_at_its_pace(answering):
    fleet = fleet_at(answering)
    try:
        fleet.start(Phase("partition", HEARTBEAT, INTERVAL, 10, silent=True))
        time.sleep(SECONDS)
        fleet.start(Phase("back", HEARTBEAT, INTERVAL, SECONDS))  # ends the silence early
        silence, back = fleet.collect("partition"), fleet.collect("back")
    finally:
        fleet.close()
    assert (silence.offered, silence.answered, len(silence.offered_due)) == (0, 0, 0)
    expected = NODES * SECONDS / INTERVAL
    assert 0.8 * expected <= back.offered <= 1.2 * expected
    assert back.nodes == set(range(NODES))
    assert len(back.offered_due) == back.offered and sorted(back.due_times) == sorted(back.offered_due)


def test_the_due_time_of_every_slot_left_unsent_is_kept(silent, monkeypatch):
    monkeypatch.setattr(pacer, "MAX_IN_FLIGHT", 5)
    monkeypatch.setattr(pacer, "TIMEOUT", 0.5)
    fleet = fleet_at(silent)
    try:
        fleet.start(Phase("measured", HEARTBEAT, INTERVAL, SECONDS))
        stats = fleet.collect("measured")
    finally:
        fleet.close()
    assert len(stats.unsent_due) == stats.unsent > 0
    assert set(stats.unsent_due) <= set(stats.offered_due)
