"""The reconciler under a real Celery worker and beat, on Redis and a database file of its own."""

from __future__ import annotations

import sqlite3
import textwrap

import pytest

from devstack.polling import wait_until
from devstack.stack import Stack

pytestmark = pytest.mark.slow

SEED = textwrap.dedent(
    """
    from agent import protocol
    from inventory.models import Deployment
    from inventory.registration import upsert_inventory
    from django.utils import timezone

    for name in ("gpu-1", "gpu-2"):
        gpus = [protocol.GPU(index=i, name="NVIDIA H100 80GB HBM3", memory_bytes=80 * 2**30) for i in range(8)]
        upsert_inventory(name, protocol.Inventory(hostname=name, gpus=gpus), now=timezone.now())
    Deployment.objects.create(name="llama", model_source="org/llama", replicas=3, gpus_per_shard=4,
                              gpu_class="H100-80GB")
    """
)


def test_beat_runs_the_reconciler_which_places_the_wanted_replicas(tmp_path, redis_server):
    redis_url = redis_server if isinstance(redis_server, str) else redis_server.url
    database = tmp_path / "llmgw.sqlite3"
    stack = Stack(
        tmp_path,
        env={"DATABASE_URL": f"sqlite:///{database}", "REDIS_URL": redis_url, "LLMGW_BEAT_PERIOD": "0.5"},
    )
    stack.manage("migrate", "--noinput", "-v0")
    stack.manage("shell", "-c", SEED)

    def states() -> list[tuple[str, str]]:
        with sqlite3.connect(f"file:{database}?mode=ro", uri=True) as db:
            return db.execute("SELECT replica_id, state FROM inventory_replica ORDER BY ordinal").fetchall()

    stack.start(stack.celery_part())
    try:
        wait_until(lambda: len(states()) == 3, 60, "three replicas")
        # Two nodes of 8 GPUs have room for four replicas of 4 GPUs: all three fit.
        wait_until(lambda: [s for _, s in states()] == ["placed"] * 3, 60, "all three placed")
        with sqlite3.connect(f"file:{database}?mode=ro", uri=True) as db:
            nodes = db.execute("SELECT node_id, COUNT(*) FROM inventory_shard GROUP BY node_id").fetchall()
        assert sorted(count for _, count in nodes) == [1, 2], "spread over both nodes"
    finally:
        stack.stop_all()
