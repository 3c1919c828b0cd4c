"""Benchmark: one reconcile pass placing 1,000 replicas onto 10,000 nodes.

Runs alone: `python -m bench.placement` (a temporary SQLite database), or with
`--database-url postgres://…` for PostgreSQL. The fleet mixes 8 × H100 nodes on
three fabrics, 4 × A100 nodes and CPU nodes, some cordoned, draining,
unreachable or lost; twenty deployments ask for single-GPU, whole-node,
two-node, A100 and CPU replicas. The headline is the whole pass (create the
pending replicas, read the fleet, place, write), median of several runs; the
query count is taken at two fleet sizes to show it does not grow with them.
Prints a Markdown table and writes bench/results/placement.json (or
placement-postgresql.json on PostgreSQL).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent

TARGET_SECONDS = 2.0
REPEATS = 5

# (deployments, replicas each, profile): 1,000 replicas in all.
MIX = [
    (8, 50, {"gpus_per_shard": 1, "gpu_class": "H100-80GB"}),
    (4, 50, {"gpus_per_shard": 8, "gpu_class": "H100-80GB"}),
    (2, 50, {"shards_per_replica": 2, "gpus_per_shard": 8, "gpu_class": "H100-80GB"}),
    (3, 50, {"gpus_per_shard": 2, "gpu_class": "A100-40GB", "memory_gb_per_shard": 64}),
    (3, 50, {"gpus_per_shard": 0, "engine": "llama.cpp", "cpu_cores_per_shard": 8, "memory_gb_per_shard": 32}),
]


def setup_django(database_url: str | None, var: Path) -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "llmgw_site.settings")
    os.environ["LLMGW_VAR_DIR"] = str(var)
    os.environ["DATABASE_URL"] = database_url or f"sqlite:///{var / 'bench.sqlite3'}"
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)


def make_deployments(scale: float) -> int:
    from inventory.models import Deployment

    total = 0
    for group, (count, replicas, profile) in enumerate(MIX):
        for k in range(count):
            wanted = max(1, int(replicas * scale))
            Deployment.objects.create(
                name=f"d{group}-{k}", model_source=f"org/model-{group}-{k}", replicas=wanted, **profile
            )
            total += wanted
    return total


def reset() -> None:
    from inventory.models import Allocation, Deployment, Replica

    Allocation.objects.all().delete()
    Replica.objects.all().delete()
    Deployment.objects.update(next_ordinal=1)


def timed_pass() -> tuple[float, float, int, Any]:
    """Wall time, this process's CPU time (what the pass costs whatever else runs), queries, result."""
    from django.db import connection, reset_queries
    from django.test.utils import CaptureQueriesContext

    from inventory.reconcile import reconcile

    # The query log keeps the last 9,000 queries: once building the fleet has
    # filled it, a pass would count as none.
    reset_queries()
    with CaptureQueriesContext(connection) as queries:
        start, cpu = time.perf_counter(), time.process_time()
        result = reconcile()
        elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu
    return elapsed, cpu, len(queries), result


def in_memory_split() -> tuple[float, float]:
    """The pass's two halves on their own: reading the fleet, and deciding over it."""
    from collections import Counter

    from inventory.models import Deployment
    from inventory.placement import Planner, Profile, load_fleet

    start = time.perf_counter()
    fleet = load_fleet()
    loaded = time.perf_counter() - start
    start = time.perf_counter()
    for deployment in Deployment.objects.order_by("name"):
        planner = Planner(fleet, Profile.of(deployment), Counter())
        for _ in range(deployment.replicas):
            planner.place()
    return loaded, time.perf_counter() - start


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--database-url", help="default: a temporary SQLite file")
    parser.add_argument("--nodes", type=int, default=10_000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="llmgw-bench-placement-") as tmp:
        setup_django(args.database_url, Path(tmp))
        from django.db import connection

        from inventory.models import Replica, ReplicaState
        from tests.factories import placement_fleet

        # The small fleet first, to count its queries; then the full one.
        placement_fleet(args.nodes // 10)
        make_deployments(0.1)
        # The first pass also cordons the fleet's empty draining nodes; count the second.
        for _ in range(2):
            reset()
            _, _, small_queries, _ = timed_pass()
        from inventory.models import Deployment, Node

        reset()
        Deployment.objects.all().delete()
        Node.objects.all().delete()

        placement_fleet(args.nodes)
        wanted = make_deployments(1.0)
        passes, cpus, queries, placed = [], [], 0, 0
        for _ in range(REPEATS):
            reset()
            elapsed, cpu, queries, result = timed_pass()
            passes.append(elapsed)
            cpus.append(cpu)
            placed = len(result.placed)
        noop, _, noop_queries, _ = timed_pass()
        assert Replica.objects.filter(state=ReplicaState.PLACED).count() == placed
        reset()
        loaded, decided = in_memory_split()
        vendor = connection.vendor

    figures = [
        {
            "name": f"reconcile pass: {wanted} replicas onto {args.nodes} nodes ({vendor}, median of {REPEATS})",
            "value": round(statistics.median(passes), 3),
            "unit": "s",
            "target": TARGET_SECONDS,
            "better": "lower",
        },
        {
            "name": "  CPU time of that pass in this process (median; the database server's not counted)",
            "value": round(statistics.median(cpus), 3),
            "unit": "s",
            "target": None,
            "better": "lower",
        },
        {
            "name": "  of which: read the fleet (bulk queries)",
            "value": round(loaded, 3),
            "unit": "s",
            "target": None,
            "better": "lower",
        },
        {
            "name": "  of which: decide in memory",
            "value": round(decided, 3),
            "unit": "s",
            "target": None,
            "better": "lower",
        },
        {
            "name": "replicas placed (the rest had no room)",
            "value": placed,
            "unit": "replicas",
            "target": None,
            "better": "higher",
        },
        {
            "name": f"queries in that pass ({args.nodes} nodes, {wanted} replicas)",
            "value": queries,
            "unit": "queries",
            "target": None,
            "better": "lower",
        },
        {
            "name": f"queries, same pass at {args.nodes // 10} nodes and a tenth of the replicas",
            "value": small_queries,
            "unit": "queries",
            "target": None,
            "better": "lower",
        },
        {
            "name": "a second pass with nothing to do",
            "value": round(noop, 3),
            "unit": "s",
            "target": None,
            "better": "lower",
        },
        {
            "name": "queries in the pass with nothing to do",
            "value": noop_queries,
            "unit": "queries",
            "target": None,
            "better": "lower",
        },
    ]
    print("| figure | value | target |")
    print("| --- | --- | --- |")
    for f in figures:
        target = f"< {f['target']} {f['unit']}" if f["target"] is not None else ""
        print(f"| {f['name']} | {f['value']} {f['unit']} | {target} |")
    # SQLite's figures are the default file; another database's go beside it.
    out = ROOT / "bench" / "results" / ("placement.json" if vendor == "sqlite" else f"placement-{vendor}.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps([{**f, "name": str(f["name"]).strip()} for f in figures], indent=2) + "\n")
    return 0 if statistics.median(passes) < TARGET_SECONDS else 1


if __name__ == "__main__":
    sys.exit(main())
