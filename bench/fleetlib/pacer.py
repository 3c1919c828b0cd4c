"""An open-loop fleet: every node posts at its own interval, whatever the server does.

A closed loop (wrk, or N clients each waiting for its answer) slows down with
the server and so never offers more than it can take; a real fleet does not
wait. Here each node has a random phase within the interval and a due time
for every beat. A worker process keeps the fleet's due times in a heap and,
on each turn of its asyncio loop (uvloop's), sends every beat that is due.
A node keeps its connection from beat to beat, as the agent's
`requests.Session` does, unless its request tail says `Connection: close`
(`request_tail(..., keep_alive=False)`): then each beat connects afresh,
which costs the proxy and the generator an accept and a close per beat.
Every slot is counted: sent on time, sent late (more than
`LATE_AFTER` behind its due time: the generator itself fell behind), or not
sent at all because `MAX_IN_FLIGHT` requests were already waiting (the server
is not answering). Latency is measured from the due time, not from the send,
so a generator that falls behind cannot hide the server's queueing.

The main process steers the workers through phases (a path and an interval
for some seconds); between phases they go on beating the heartbeat path at the
fleet's interval, so no node falls silent while the main process decides what
comes next.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import multiprocessing
import random
import resource
import threading
import time
from array import array
from collections import Counter
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess

import uvloop

HEARTBEAT = "/api/v1/heartbeat"
LATE_AFTER = 0.5  # seconds behind the due time
MAX_IN_FLIGHT = 2000  # per worker
TIMEOUT = 10.0  # the agent's own read timeout is longer; past this the beat counts as lost
# Connections a proxy keeps free beside the fleet's kept ones: its servers' and the beats that connect afresh.
ROOM = 100


@dataclass
class Phase:
    name: str
    path: str
    interval: float
    seconds: float
    # The fleet sends nothing (a partition): each node's slots pass unsent and uncounted, and it
    # resumes at its own phase of the interval once the next phase begins.
    silent: bool = False


@dataclass
class PhaseStats:
    """What one worker saw of one phase. Latencies are in seconds from each beat's due time."""

    name: str
    seconds: float = 0.0
    offered: int = 0
    unsent: int = 0
    late: int = 0
    answered: int = 0
    statuses: Counter = field(default_factory=Counter)
    errors: Counter = field(default_factory=Counter)
    latencies: array = field(default_factory=lambda: array("d"))
    # Each answered beat's due time (time.monotonic(), the same clock in every worker), beside its latency.
    due_times: array = field(default_factory=lambda: array("d"))
    # The due time of every slot, and of those sent late or not at all, to be told second by
    # second (bench.recovery).
    offered_due: array = field(default_factory=lambda: array("d"))
    late_due: array = field(default_factory=lambda: array("d"))
    unsent_due: array = field(default_factory=lambda: array("d"))
    cpu_seconds: float = 0.0
    in_flight: int = 0
    # Which nodes (by their index in the fleet) had a beat answered with 2xx in this phase.
    nodes: set = field(default_factory=set)

    def merge(self, other: PhaseStats) -> None:
        self.offered += other.offered
        self.unsent += other.unsent
        self.late += other.late
        self.answered += other.answered
        self.statuses.update(other.statuses)
        self.errors.update(other.errors)
        self.latencies.extend(other.latencies)
        self.due_times.extend(other.due_times)
        self.offered_due.extend(other.offered_due)
        self.late_due.extend(other.late_due)
        self.unsent_due.extend(other.unsent_due)
        self.nodes |= other.nodes
        self.cpu_seconds += other.cpu_seconds
        self.seconds = max(self.seconds, other.seconds)


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


class _Beat:
    """One heartbeat in flight: whose it is, when it was due, and the phase it counts in."""

    __slots__ = ("due", "node", "stats")

    def __init__(self, node: int, due: float, stats: PhaseStats):
        self.node, self.due, self.stats = node, due, stats


class _Connection(asyncio.Protocol):
    """A node's connection, kept open from beat to beat as the agent's `requests.Session` keeps it.

    An answer ends at its `Content-Length`; the connection then waits for the
    node's next beat, unless the server said `Connection: close` or closed it
    (the next beat connects afresh).
    """

    __slots__ = ("beat", "buffer", "closing", "pacer", "timed_out", "timer", "transport")

    def __init__(self, pacer: _Pacer):
        self.pacer = pacer
        self.transport: asyncio.Transport | None = None
        self.beat: _Beat | None = None
        self.buffer = b""
        self.timer: asyncio.TimerHandle | None = None
        self.timed_out = False
        self.closing = False

    @property
    def idle(self) -> bool:
        return self.beat is None and not self.closing and self.transport is not None

    def send(self, request: bytes, beat: _Beat) -> None:
        self.beat = beat
        self.timer = self.pacer.loop.call_later(TIMEOUT, self.abort)
        assert self.transport is not None, "sent only on an idle, so connected, connection"
        self.transport.write(request)

    def connection_made(self, transport) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        end = self.buffer.find(b"\r\n\r\n")
        if end < 0 or self.beat is None:
            return
        head = self.buffer[:end].lower()
        length = 0
        for line in head.split(b"\r\n")[1:]:
            name, _, value = line.partition(b":")
            if name == b"content-length":
                length = int(value)
            elif name == b"connection" and value.strip() == b"close":
                self.closing = True
        if len(self.buffer) < end + 4 + length:
            return
        try:
            status = int(head.split(b" ", 2)[1])
        except (IndexError, ValueError):
            status = 0
        self.buffer = self.buffer[end + 4 + length :]
        self.pacer.answered(self._finish(), status)
        if self.closing and self.transport is not None:
            self.transport.close()

    def _finish(self) -> _Beat:
        """The beat under way, now over."""
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        beat, self.beat = self.beat, None
        assert beat is not None
        return beat

    def abort(self) -> None:
        self.timed_out = True
        if self.transport is not None:
            self.transport.abort()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closing = True
        if self.beat is not None:
            self.pacer.failed(self._finish().stats, "timeout" if self.timed_out else "no answer")


class _Pacer:
    def __init__(self, host: str, port: int, requests: list[bytes], indices: list[int], interval: float, seed: int):
        self.host, self.port = host, port
        self.indices = indices  # each request's node, by its index in the whole fleet
        self.tails = requests  # everything after "POST <path>"
        self.interval = interval
        self.loop = asyncio.get_running_loop()
        start = time.monotonic()
        rng = random.Random(seed)
        self.due = [(start + rng.uniform(0, interval), i) for i in range(len(requests))]
        heapq.heapify(self.due)
        self.filler = PhaseStats("filler")
        self.current, self.current_phase, self.phase_end = self.filler, Phase("filler", HEARTBEAT, interval, 0), 0.0
        self.finished: list[tuple[PhaseStats, float]] = []
        self.in_flight = 0
        self.phase_cpu = 0.0
        self.phase_started = 0.0
        self.outbox: list[PhaseStats] = []
        self.stopping = False
        # Each node's open connection, by its index in `tails`.
        self.connections: dict[int, _Connection] = {}

    # -- called by the control thread, in the loop --------------------------------------------

    def begin(self, phase: Phase) -> None:
        self._end_current()
        self.current, self.current_phase = PhaseStats(phase.name), phase
        self.phase_started = time.monotonic()
        self.phase_end = self.phase_started + phase.seconds
        self.phase_cpu = _cpu()

    def _end_current(self) -> None:
        if self.current is self.filler:
            return
        self.current.cpu_seconds = _cpu() - self.phase_cpu
        self.current.seconds = time.monotonic() - self.phase_started
        self.finished.append((self.current, time.monotonic() + TIMEOUT + 1))
        self.current = self.filler
        self.current_phase = Phase("filler", HEARTBEAT, self.interval, 0)

    # -- the exchanges' callbacks ----------------------------------------------------------------

    def answered(self, beat: _Beat, status: int) -> None:
        stats = beat.stats
        self.in_flight -= 1
        stats.in_flight -= 1
        stats.statuses[status] += 1
        if 200 <= status < 300:
            stats.answered += 1
            stats.nodes.add(self.indices[beat.node])
            stats.latencies.append(time.monotonic() - beat.due)
            stats.due_times.append(beat.due)

    def failed(self, stats: PhaseStats, why: str) -> None:
        self.in_flight -= 1
        stats.in_flight -= 1
        stats.errors[why] += 1

    # -- sending ---------------------------------------------------------------------------------

    def fire(self, index: int, due: float, now: float) -> None:
        stats = self.current
        stats.offered += 1
        stats.offered_due.append(due)
        if self.in_flight >= MAX_IN_FLIGHT:
            stats.unsent += 1
            stats.unsent_due.append(due)
            return
        if now - due > LATE_AFTER:
            stats.late += 1
            stats.late_due.append(due)
        self.in_flight += 1
        stats.in_flight += 1
        request = b"POST " + self.current_phase.path.encode() + self.tails[index]
        beat = _Beat(index, due, stats)
        connection = self.connections.get(index)
        if connection is not None and connection.idle:
            connection.send(request, beat)
            return
        # The node's connection is closed, or still waiting on its previous beat (an open
        # loop sends on time regardless): this beat goes on a new one, kept for the next.
        self.loop.create_task(self._connect(index, request, beat))

    async def _connect(self, index: int, request: bytes, beat: _Beat) -> None:
        connection = _Connection(self)
        try:
            await asyncio.wait_for(self.loop.create_connection(lambda: connection, self.host, self.port), TIMEOUT)
        except (OSError, TimeoutError) as exc:
            self.failed(beat.stats, type(exc).__name__)
            return
        previous = self.connections.get(index)
        if previous is None or not previous.idle:
            self.connections[index] = connection
        connection.send(request, beat)

    async def run(self) -> None:
        while not self.stopping:
            now = time.monotonic()
            if self.current is not self.filler and now >= self.phase_end:
                self._end_current()
            self._report(now)
            interval = self.current_phase.interval
            silent = self.current_phase.silent
            while self.due[0][0] <= now:
                due, index = self.due[0]
                if not silent:
                    self.fire(index, due, now)
                heapq.heapreplace(self.due, (due + interval, index))
            await asyncio.sleep(min(max(self.due[0][0] - time.monotonic(), 0.001), 0.05))

    def _report(self, now: float) -> None:
        keep = []
        for stats, deadline in self.finished:
            if stats.in_flight <= 0 or now >= deadline:
                self.outbox.append(stats)
            else:
                keep.append((stats, deadline))
        self.finished = keep


def _worker(
    conn: Connection, host: str, port: int, requests: list[bytes], indices: list[int], interval: float, seed: int
) -> None:
    # Thousands of connections may be open at once while the server is slow.
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))

    async def main() -> None:
        pacer = _Pacer(host, port, requests, indices, interval, seed)
        loop = asyncio.get_running_loop()

        def listen() -> None:
            while True:
                try:
                    command = conn.recv()
                except EOFError:
                    command = None
                if command is None:
                    loop.call_soon_threadsafe(setattr, pacer, "stopping", True)
                    return
                loop.call_soon_threadsafe(pacer.begin, command)

        threading.Thread(target=listen, daemon=True).start()

        async def post() -> None:
            while not pacer.stopping:
                while pacer.outbox:
                    conn.send(pacer.outbox.pop(0))
                await asyncio.sleep(0.05)

        sender = asyncio.ensure_future(post())
        await pacer.run()
        sender.cancel()

    # uvloop: each beat costs the generator less CPU, which here is the control plane's CPU too.
    uvloop.run(main())


def fleet_tails(host: str, port: int, nodes: list[tuple[str, bytes]], proxy_connections: int) -> list[bytes]:
    """Each node's request tail, given its token and body.

    Agents keep their connection between beats. A proxy that can hold only
    `proxy_connections` (a sandbox's descriptor limit, devstack/proxy.py) gets
    as many kept as leave it ROOM: the first nodes keep theirs, the rest
    connect afresh each beat, rather than every node connecting afresh.
    """
    kept = proxy_connections - ROOM
    return [request_tail(host, port, token, body, index < kept) for index, (token, body) in enumerate(nodes)]


def request_tail(host: str, port: int, token: str, body: bytes, keep_alive: bool = True) -> bytes:
    """Everything of a request after "POST <path>": the node's headers and body."""
    close = "" if keep_alive else "Connection: close\r\n"
    return (
        f" HTTP/1.1\r\nHost: {host}:{port}\r\nAuthorization: Bearer {token}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n{close}\r\n"
    ).encode() + body


class PacedFleet:
    """Worker processes sharing the fleet; `run(phase)` runs one phase on all of them and merges what they saw."""

    def __init__(self, host: str, port: int, requests: list[bytes], interval: float, workers: int = 2):
        self.interval = interval
        self.connections: list[Connection] = []
        self.processes: list[BaseProcess] = []
        context = multiprocessing.get_context("fork")
        for w in range(workers):
            parent, child = context.Pipe()
            share, indices = requests[w::workers], list(range(len(requests)))[w::workers]
            process = context.Process(
                target=_worker, args=(child, host, port, share, indices, interval, w + 1), daemon=True
            )
            process.start()
            self.connections.append(parent)
            self.processes.append(process)

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self.processes if p.pid is not None]

    def start(self, phase: Phase) -> None:
        for conn in self.connections:
            conn.send(phase)

    def collect(self, name: str) -> PhaseStats:
        merged = PhaseStats(name)
        for conn in self.connections:
            merged.merge(conn.recv())
        return merged

    def close(self) -> None:
        for conn in self.connections:
            with contextlib.suppress(OSError):
                conn.send(None)
        for process in self.processes:
            process.join(5)
            if process.is_alive():
                process.terminate()
