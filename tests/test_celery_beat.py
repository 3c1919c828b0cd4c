"""End to end: a real granian, Celery worker and beat on the test Redis mark a silent node unreachable, then lost.

The stack runs on a SQLite file of its own, with the thresholds shortened
through the environment; the test reads the node's liveness from that file.
"""

from __future__ import annotations

import sqlite3
import time

import pytest
import requests

from agent import protocol
from devstack.polling import wait_until
from devstack.ports import free_port
from devstack.stack import Stack
from livestate import keys
from tests.agentapi import JOIN_TOKEN, register_over_http
from tests.factories import make_inventory

pytestmark = [pytest.mark.slow]

UNREACHABLE_AFTER = 3.0
LOST_AFTER = 6.0
BEAT_PERIOD = 0.5
# Time for a worker to pick up the beat's task and for this test to notice.
SLACK = 1.5


@pytest.fixture
def stack(tmp_path, _redis_everywhere):
    database = tmp_path / "e2e.sqlite3"
    stack = Stack(
        tmp_path,
        env={
            "DATABASE_URL": f"sqlite:///{database}",
            "REDIS_URL": _redis_everywhere,
            "LLMGW_JOIN_TOKEN": JOIN_TOKEN,
            "LLMGW_UNREACHABLE_AFTER": str(UNREACHABLE_AFTER),
            "LLMGW_LOST_AFTER": str(LOST_AFTER),
            "LLMGW_BEAT_PERIOD": str(BEAT_PERIOD),
        },
        web_port=free_port(),
        workers=1,
    )
    stack.manage("migrate", "--noinput", "-v0")
    try:
        stack.start_web()
        stack.start(stack.celery_part())
        stack.database = database
        yield stack
    finally:
        stack.stop_all()


def node_row(stack, node_id: str) -> tuple[str, str]:
    with sqlite3.connect(stack.database, timeout=5) as db:
        return db.execute("SELECT liveness, last_heartbeat FROM inventory_node WHERE id = ?", (node_id,)).fetchone()


def test_a_node_whose_agent_stops_becomes_unreachable_then_lost(stack, redis_client):
    base = f"http://127.0.0.1:{stack.web_port}/api/v1"
    registration = protocol.Register(node_id="gpu-1", inventory=make_inventory("gpu-1.example", gpus=1))
    token = register_over_http(f"http://127.0.0.1:{stack.web_port}", registration)
    registered_at = node_row(stack, "gpu-1")[1]

    def beat() -> protocol.HeartbeatReply:
        response = requests.post(
            f"{base}/heartbeat",
            data=b"{}",
            headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
            timeout=10,
        )
        assert response.status_code == 200, response.text
        return protocol.decode(response.content, protocol.HeartbeatReply)

    # Beating for longer than the threshold keeps it alive: the beat's flush
    # carries the times Redis holds into the database before each sweep.
    wait_until(lambda: redis_client.hget(keys.SELF_METRICS, "sweeps"), 60, "the beat's first sweep")
    started = time.monotonic()
    while time.monotonic() - started < UNREACHABLE_AFTER * 2:
        last_beat = time.monotonic()  # before the request: the node was silent from then at the latest
        assert beat().state == "ready"
        assert node_row(stack, "gpu-1")[0] == "alive"
        time.sleep(BEAT_PERIOD / 2)  # the agent's interval, not synchronisation
    assert node_row(stack, "gpu-1")[1] > registered_at

    wait_until(lambda: node_row(stack, "gpu-1")[0] == "unreachable", 30, "gpu-1 to become unreachable")
    silent_for = time.monotonic() - last_beat
    assert UNREACHABLE_AFTER <= silent_for <= UNREACHABLE_AFTER + BEAT_PERIOD + SLACK

    wait_until(lambda: node_row(stack, "gpu-1")[0] == "lost", 30, "gpu-1 to become lost")
    silent_for = time.monotonic() - last_beat
    assert LOST_AFTER <= silent_for <= LOST_AFTER + BEAT_PERIOD + SLACK

    # The agent comes back: answered as alive at once; the next sweep's flush writes it.
    back = time.monotonic()
    assert beat().state == "ready"
    wait_until(lambda: node_row(stack, "gpu-1")[0] == "alive", 30, "gpu-1 to be alive again")
    assert time.monotonic() - back <= BEAT_PERIOD + SLACK
