"""Slow clients at the proxy while a fleet beats: none of them reaches a web worker.

Ten connections that send a heartbeat's request line and then one header line
every 3 s, never finishing (and open again as soon as they are cut), held every
sync worker when gunicorn faced clients itself: every heartbeat timed out and
healthy nodes were marked unreachable. The stack starts as `make run` starts it
(HAProxy in front of granian, the Celery worker and beat sweeping), with short
thresholds so that a node falsely unreachable would show within the test.
"""

from __future__ import annotations

import asyncio
import secrets
import sqlite3
import time
from dataclasses import dataclass, field

import pytest

from bench.soaklib.fleet import Fleet
from devstack.polling import wait_until
from devstack.ports import free_port
from devstack.stack import Stack

pytestmark = pytest.mark.slow

NODES = 20
ATTACKERS = 10
ATTACK_SECONDS = 30.0
INTERVAL = 1.0
UNREACHABLE_AFTER = 6.0
# deploy/haproxy.cfg's `timeout http-request`.
HTTP_REQUEST_TIMEOUT = 10.0


@dataclass
class SlowConnection:
    opened: float
    closed: float | None = None
    answer: bytes = b""
    lines_sent: int = 0


@dataclass
class Attack:
    connections: list[SlowConnection] = field(default_factory=list)


async def slow_client(port: int, attack: Attack, until: float) -> None:
    """A heartbeat's head, one header line every 3 s, never finished; again whenever the far side hangs up."""
    while time.monotonic() < until:
        record = SlowConnection(opened=time.monotonic())
        attack.connections.append(record)
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            writer.write(b"POST /api/v1/heartbeat HTTP/1.1\r\nHost: x\r\n")
            await writer.drain()
            while time.monotonic() < until:
                try:
                    record.answer = await asyncio.wait_for(reader.read(4096), 3.0)
                except TimeoutError:
                    writer.write(f"X-Slow-{record.lines_sent}: still coming\r\n".encode())
                    await writer.drain()
                    record.lines_sent += 1
                    continue
                record.closed = time.monotonic()
                break
        except ConnectionError:
            record.closed = time.monotonic()
        finally:
            writer.close()


def query(database, sql: str) -> list[tuple]:
    with sqlite3.connect(f"file:{database}?mode=ro", uri=True, timeout=10) as db:
        return db.execute(sql).fetchall()


def test_slow_clients_are_cut_by_the_proxy_while_every_heartbeat_is_answered(tmp_path, redis_server):
    redis_url = redis_server if isinstance(redis_server, str) else redis_server.url
    database = tmp_path / "llmgw.sqlite3"
    join_token = secrets.token_urlsafe(32)
    stack = Stack(
        tmp_path,
        env={
            "DATABASE_URL": f"sqlite:///{database}",
            "REDIS_URL": redis_url,
            "LLMGW_JOIN_TOKEN": join_token,
            "LLMGW_HEARTBEAT_INTERVAL": str(INTERVAL),
            "LLMGW_BEAT_PERIOD": "1",
            "LLMGW_UNREACHABLE_AFTER": str(UNREACHABLE_AFTER),
            "LLMGW_LOST_AFTER": "600",
            # The whole fleet registers from one address at once.
            "LLMGW_REGISTER_PER_MINUTE": "1000",
        },
        web_port=free_port(),
        workers=2,
    )
    # One node falls silent when the attack begins: that it is marked unreachable shows the
    # sweep ran throughout, so that no other node being marked means something.
    canary = "canary-00000"
    try:
        stack.manage("migrate", "--noinput", "-v0")
        stack.start_web()
        stack.start(stack.celery_part())
        fleet = Fleet("127.0.0.1", stack.web_port, join_token, NODES, interval=INTERVAL, timeout=10.0)
        canaries = Fleet("127.0.0.1", stack.web_port, join_token, 1, interval=INTERVAL, prefix="canary")
        attack = Attack()

        async def scenario() -> float:
            beating = asyncio.gather(fleet.run(), canaries.run())
            try:
                deadline = time.monotonic() + 30
                while not all(node.last_ok_at for node in fleet.nodes + canaries.nodes):
                    assert time.monotonic() < deadline, "the fleet did not register and beat within 30 s"
                    await asyncio.sleep(0.2)
                canaries.nodes[0].silent = True
                started = time.time()
                until = time.monotonic() + ATTACK_SECONDS
                await asyncio.gather(*(slow_client(stack.web_port, attack, until) for _ in range(ATTACKERS)))
            finally:
                fleet.stop()
                canaries.stop()
                await beating
            return started

        attack_started = asyncio.run(scenario())

        during = [r for r in fleet.requests if r.kind == "heartbeat" and r.at >= attack_started]
        failed = [r for r in during if r.status != 200]
        assert len(during) >= NODES * ATTACK_SECONDS / INTERVAL * 0.8, "the fleet kept beating"
        assert failed == [], f"{len(failed)} of {len(during)} heartbeats failed during the attack: {failed[:5]}"

        # Cut by the proxy's `timeout http-request` with a 408, never answered by a worker.
        first_wave = attack.connections[:ATTACKERS]
        for connection in first_wave:
            assert connection.closed is not None, "a slow client was never cut"
            held = connection.closed - connection.opened
            assert HTTP_REQUEST_TIMEOUT - 1 <= held <= HTTP_REQUEST_TIMEOUT + 4, held
            assert connection.answer.startswith(b"HTTP/1.1 408"), connection.answer[:80]
        assert len(attack.connections) >= ATTACKERS * 2, "the slow clients came back after being cut"

        wait_until(
            lambda: query(database, f"SELECT liveness FROM inventory_node WHERE id = '{canary}'") == [("unreachable",)],
            UNREACHABLE_AFTER + 15,
            "the silent canary to be marked unreachable",
        )
        marked = query(
            database,
            "SELECT node_id FROM inventory_nodeevent WHERE kind = 'liveness' AND to_state = 'unreachable'",
        )
        assert marked == [(canary,)]
    finally:
        stack.stop_all()
