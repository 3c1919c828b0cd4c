"""End to end: a real Celery worker with beat lives through a Redis restarted without its data, and keeps again.

Redis is Celery's broker, so a restart breaks the worker's connection. When
that happened while the worker held tasks it had not started (at 10,000 nodes
its two processes are busy keeping cards and shard lists, and the next tasks
wait with it), the worker died ("Unrecoverable error: AttributeError") and
took beat with it: nothing refilled the emptied Redis, and the whole fleet
read the database until each node's own heartbeat had cached its card again
(docs/operations.md, "Redis restarted without its data").

The test holds the worker's processes still (SIGSTOP), so that the tasks it
sends stay with the worker unstarted whatever the machine's speed, restarts a
Redis of its own on the same port with nothing in it, lets the processes go,
and waits for the keeping's mark to be set again in the new Redis.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest
import redis
from celery import Celery

from devstack.polling import wait_until
from devstack.ports import free_port
from devstack.redis_server import RedisServer
from devstack.stack import Stack
from livestate import keys

pytestmark = [pytest.mark.slow]

# Fewer than the worker takes ahead of its two processes (prefetch 4 each), so all of them are held by it.
HELD_TASKS = 6


def children(pid: int) -> list[int]:
    return [
        int(child)
        for thread in os.listdir(f"/proc/{pid}/task")
        for child in Path(f"/proc/{pid}/task/{thread}/children").read_text().split()
    ]


@pytest.fixture
def broker(tmp_path):
    server = RedisServer(tmp_path / "redis").start()
    try:
        yield server
    finally:
        server.stop()


def received(stack: Stack) -> int:
    """How many tasks the worker has said it received (its log's INFO lines)."""
    return (stack.logs / "celery.log").read_text().count("] received")


@pytest.fixture
def worker(tmp_path, broker):
    stack = Stack(
        tmp_path,
        env={"DATABASE_URL": f"sqlite:///{tmp_path / 'worker.sqlite3'}", "REDIS_URL": broker.url},
        web_port=free_port(),
        workers=1,
    )
    stack.manage("migrate", "--noinput", "-v0")
    try:
        stack.start(stack.celery_part())
        yield stack
    finally:
        stack.stop_all()


def test_the_worker_keeps_again_after_redis_restarts_empty_while_it_holds_tasks(broker, worker):
    client = redis.Redis(port=broker.port, socket_timeout=5)
    wait_until(lambda: client.exists(keys.CARDS_KEPT) == 1, 60, "the first keeping of the cards")
    process = worker.parts["celery"].process
    assert process is not None
    held = children(process.pid)
    assert held, "the worker has no pool or beat processes"
    for pid in held:
        os.kill(pid, signal.SIGSTOP)
    try:
        before = received(worker)
        sender = Celery(broker=broker.url)
        for _ in range(HELD_TASKS):
            sender.send_task("nodes.tasks.keep_cards")
        sender.close()
        # Received by the worker, which cannot start them.
        wait_until(lambda: received(worker) >= before + HELD_TASKS, 30, "the worker to receive the tasks")

        broker.stop()
        broker.start()
        assert not client.exists(keys.CARDS_KEPT)
    finally:
        for pid in held:
            os.kill(pid, signal.SIGCONT)

    # The tasks the worker held may run even as it dies; beat's next ones run only in a worker that lived.
    wait_until(lambda: client.exists(keys.CARDS_KEPT) == 1, 30, "a keeping of the cards in the restarted Redis")
    client.delete(keys.CARDS_KEPT)
    wait_until(lambda: client.exists(keys.CARDS_KEPT) == 1, 30, "the keeping beat sends next")
    assert process.poll() is None
