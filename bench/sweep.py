"""Benchmark: one stale sweep that changes 10,000 nodes, each way.

Runs alone: `python -m bench.sweep` (a temporary SQLite database and a private
Redis), or with `--database-url postgres://…` for PostgreSQL. The fleet is
10,000 nodes built in bulk. Three sweeps, each the median of several runs:

- marking the whole fleet unreachable (every node silent past the threshold);
- reviving the whole fleet (every node unreachable, a heartbeat time of each
  in Redis, as the beat script leaves them after an outage);
- the ordinary sweep: 10,000 heartbeat times flushed, nothing to change.

Each through `inventory.sweep.run`, as the Celery task calls it (lock, record,
grace period: the record is set so that no grace period applies). Beside
them, the old way (one compare-and-set UPDATE and one event per node)
measured on a tenth of the fleet, for comparison. Prints a Markdown table and
writes bench/results/sweep.json (or sweep-postgresql.json on PostgreSQL).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent

TARGET_SECONDS = 2.0
REPEATS = 3


def setup_django(database_url: str | None, var: Path, redis_url: str) -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "llmgw_site.settings")
    os.environ["LLMGW_VAR_DIR"] = str(var)
    os.environ["DATABASE_URL"] = database_url or f"sqlite:///{var / 'bench.sqlite3'}"
    os.environ["REDIS_URL"] = redis_url
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)


def build_fleet(size: int) -> list[str]:
    from django.utils import timezone

    from inventory.models import Node

    now = timezone.now()
    # A database given with --database-url may hold an earlier run's fleet.
    Node.objects.all().delete()
    ids = [f"node-{i:05d}" for i in range(size)]
    Node.objects.bulk_create(
        (Node(id=node_id, hostname=f"{node_id}.example", registered_at=now, last_heartbeat=now) for node_id in ids),
        batch_size=1000,
    )
    return ids


def reset(liveness: str, heard_seconds_ago: float) -> None:
    """Every node in `liveness`, last heard `heard_seconds_ago`; no events, nothing held in Redis."""
    from django.utils import timezone

    import livestate
    from inventory.models import Node, NodeEvent

    NodeEvent.objects.all().delete()
    Node.objects.update(liveness=liveness, last_heartbeat=timezone.now() - timedelta(seconds=heard_seconds_ago))
    livestate.client().flushdb()


def no_grace() -> None:
    """A sweep record saying the sweep ran a moment ago and heartbeats are arriving: no grace period applies."""
    from livestate import sweeprecord
    from livestate.sweeprecord import SweepRecord

    now = time.time()
    sweeprecord.write(SweepRecord(swept_at=now - 1, grace_until=0.0, quiet=False))
    sweeprecord.Pulse().accepted(now)


def hold_heartbeats(ids: list[str]) -> None:
    """A heartbeat time of every node in Redis, as the beat script notes them."""
    import livestate
    from livestate import keys

    now = repr(time.time())
    pipe = livestate.client().pipeline(transaction=False)
    for start in range(0, len(ids), 1000):
        pipe.hset(keys.HEARTBEATS, mapping={node_id: now for node_id in ids[start : start + 1000]})
    pipe.execute()


def timed_sweep() -> tuple[float, float, int, Any]:
    """Wall time, this process's CPU time (SQLite's included, PostgreSQL's not), queries, result."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from inventory import sweep

    with CaptureQueriesContext(connection) as queries:
        start, cpu = time.perf_counter(), time.process_time()
        outcome = sweep.run()
        elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu
    assert outcome.skipped is None and outcome.result is not None, outcome
    return elapsed, cpu, len(queries), outcome.result


def old_way(ids: list[str]) -> float:
    """The sweep before bulk changes: one compare-and-set UPDATE and one event per node."""
    from django.utils import timezone

    from inventory.liveness import change_liveness
    from inventory.models import Liveness

    now = timezone.now()
    start = time.perf_counter()
    for node_id in ids:
        change_liveness(node_id, Liveness.ALIVE, Liveness.UNREACHABLE, "bench", now)
    return time.perf_counter() - start


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--database-url", help="default: a temporary SQLite file")
    parser.add_argument("--nodes", type=int, default=10_000)
    args = parser.parse_args()
    from devstack.redis_server import RedisServer

    with tempfile.TemporaryDirectory(prefix="llmgw-bench-sweep-") as tmp:
        redis_server = RedisServer(Path(tmp) / "redis").start()
        try:
            figures, vendor = measure(args.nodes, args.database_url, Path(tmp), redis_server.url)
        finally:
            redis_server.stop()

    print("| figure | value | target |")
    print("| --- | --- | --- |")
    for f in figures:
        target = f"≤ {f['target']} {f['unit']}" if f["target"] is not None else ""
        print(f"| {f['name']} | {f['value']} {f['unit']} | {target} |")
    out = ROOT / "bench" / "results" / ("sweep.json" if vendor == "sqlite" else f"sweep-{vendor}.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps([{**f, "name": f["name"].strip()} for f in figures], indent=2) + "\n")
    return 0


def measure(size: int, database_url: str | None, var: Path, redis_url: str) -> tuple[list[dict], str]:
    setup_django(database_url, var, redis_url)
    from django.conf import settings
    from django.db import connection

    from inventory.models import Liveness, Node

    ids = build_fleet(size)
    silent_for = settings.LLMGW_UNREACHABLE_AFTER + 5
    runs: dict[str, list[tuple[float, float, int]]] = {"marking": [], "reviving": [], "ordinary": []}
    for _ in range(REPEATS):
        reset(Liveness.ALIVE, silent_for)
        no_grace()
        elapsed, cpu, queries, result = timed_sweep()
        assert len(result.unreachable) == size, len(result.unreachable)
        runs["marking"].append((elapsed, cpu, queries))

        reset(Liveness.UNREACHABLE, silent_for)
        no_grace()
        hold_heartbeats(ids)
        elapsed, cpu, queries, result = timed_sweep()
        assert len(result.revived) == size and not result.unreachable, (len(result.revived), len(result.unreachable))
        runs["reviving"].append((elapsed, cpu, queries))

        reset(Liveness.ALIVE, 1)
        no_grace()
        hold_heartbeats(ids)
        elapsed, cpu, queries, result = timed_sweep()
        assert result.flushed == size and not result.unreachable
        runs["ordinary"].append((elapsed, cpu, queries))
    load = os.getloadavg()[0]

    reset(Liveness.ALIVE, silent_for)
    tenth = ids[: size // 10]
    old = old_way(tenth)
    assert Node.objects.filter(liveness=Liveness.UNREACHABLE).count() == len(tenth)
    vendor = connection.vendor

    def figure(name: str, value: float, unit: str, target: float | None = None) -> dict:
        return {"name": name, "value": value, "unit": unit, "target": target, "better": "lower"}

    def median(kind: str, part: int) -> float:
        return round(statistics.median(run[part] for run in runs[kind]), 3)

    return [
        figure(
            f"sweep marking {size} nodes unreachable ({vendor}, median of {REPEATS})",
            median("marking", 0),
            "s",
            TARGET_SECONDS,
        ),
        figure("  CPU time of that sweep in this process", median("marking", 1), "s"),
        figure("  queries in that sweep", runs["marking"][-1][2], "queries"),
        figure(
            f"sweep reviving {size} unreachable nodes from their heartbeats in Redis (median of {REPEATS})",
            median("reviving", 0),
            "s",
            TARGET_SECONDS,
        ),
        figure("  CPU time of that sweep in this process", median("reviving", 1), "s"),
        figure("  queries in that sweep", runs["reviving"][-1][2], "queries"),
        figure(
            f"ordinary sweep: {size} heartbeat times flushed, nothing to change (median of {REPEATS})",
            median("ordinary", 0),
            "s",
        ),
        figure("  queries in that sweep", runs["ordinary"][-1][2], "queries"),
        figure(
            f"the old way, a query and an event per node: {len(tenth)} nodes marked unreachable",
            round(old, 3),
            "s",
        ),
        figure("machine's load average (1 min) at the end of the sweeps", round(load, 1), "", None),
    ], vendor


if __name__ == "__main__":
    raise SystemExit(main())
