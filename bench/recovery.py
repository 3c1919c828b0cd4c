"""Recovery: a paced fleet, the web tier stopped for two minutes, and how long until every node is alive again.

    python -m bench.recovery [--nodes 10000] [--outage 120] [--interval 5]

The stack starts as `make run` starts it (devstack.stack: its own Redis,
granian with cores + 1 workers, Celery worker with beat) on PostgreSQL
(BENCH_POSTGRES, default postgres://postgres@127.0.0.1:5432, database
llmgw_bench_recovery, recreated). The fleet is bench/soaklib/fleet.py's: every
node registers, then beats every interval on its own timer with a realistic
body (load, shard statuses), open loop; a beat the web tier cannot answer is
lost, not retried early.

Once every node has registered and is alive, the web tier is stopped for
`--outage` seconds while the fleet and the sweeper go on, then started again.
The figures: when the last node was alive again after the return (target:
within 60 s), how many nodes were marked unreachable during the outage and
after the return (target: none; a node marked after the return is a flap), the
most nodes unreachable at once, and the heartbeats answered after the return.
Prints a Markdown table and writes bench/results/recovery.json.

With `--disruption-threshold 1` the sweep believes the fleet's silence (the
rule that marks nobody while no heartbeat arrives is off), so the outage
marks every node unreachable and the return measures their revival in bulk;
that run writes bench/results/recovery-revivals.json.

    python -m bench.recovery --cases all [--nodes 10000] [--silence 210] [--watch 60]
    python -m bench.recovery --cases partition,flushed …

`--cases` runs issue 25's moments instead, on one stack with a PostgreSQL
cluster and a Redis of its own (they are flushed and restarted), with the
paced fleet of bench.heartbeat: the first beats after registration, a
partition (the fleet silent for `--silence` s, the control plane up), Redis
flushed, Redis restarted with and without its data, PostgreSQL restarted.
Each is reported second by second until the fleet is back (answered, p99,
beats not sent in time, failures, flaps) with a summary line
(bench/fleetlib/disruptions.py); writes bench/results/recovery-cases-NODES.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import secrets
import shutil
import sys
import tempfile
import time
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path

from bench.fleetlib import disruptions
from bench.soaklib.fleet import Fleet
from bench.soaklib.postgres import recreate_database
from devstack.ports import free_port
from devstack.stack import Stack, default_workers

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results" / "recovery.json"
TARGET_SECONDS = 60.0


def liveness_counts() -> dict[str, int]:
    from django.db.models import Count

    from inventory.models import Node

    return dict(Node.objects.order_by().values("liveness").annotate(n=Count("pk")).values_list("liveness", "n"))


def marked_unreachable_since(since: float) -> int:
    from inventory.models import Liveness, NodeEvent

    return NodeEvent.objects.filter(
        kind=NodeEvent.Kind.LIVENESS, to_state=Liveness.UNREACHABLE, at__gte=datetime.fromtimestamp(since, UTC)
    ).count()


class Run:
    def __init__(self, args: argparse.Namespace):
        self.args = args
        self.var = Path(tempfile.mkdtemp(prefix="llmgw-bench-recovery-"))
        self.timeline: list[tuple[float, int, int]] = []  # (seconds since return, alive, unreachable)

    def start_stack(self) -> None:
        a = self.args
        server = os.environ.get("BENCH_POSTGRES", "postgres://postgres@127.0.0.1:5432")
        database_url = f"{server}/llmgw_bench_recovery"
        recreate_database(database_url)
        self.web_port = free_port()
        self.join_token = secrets.token_urlsafe(32)
        env = {
            "DATABASE_URL": database_url,
            "REDIS_URL": f"redis://127.0.0.1:{free_port()}/0",
            "LLMGW_JOIN_TOKEN": self.join_token,
            "LLMGW_HEARTBEAT_INTERVAL": str(a.interval),
            "LLMGW_DISRUPTION_THRESHOLD": str(a.disruption_threshold),
            # The whole simulated fleet registers from 127.0.0.1.
            "LLMGW_REGISTER_PER_MINUTE": str(max(a.nodes * 4, 100)),
            "LLMGW_VAR_DIR": str(self.var),
        }
        self.stack = Stack(self.var, env, web_port=self.web_port, workers=a.workers)
        self.stack.start(self.stack.redis_part())
        self.stack.prepare()
        self.stack.start_web()
        self.stack.start(self.stack.celery_part())
        os.environ.update(self.stack.env)
        os.environ.setdefault("DJANGO_SETTINGS_MODULE", "llmgw_site.settings")
        import django

        django.setup()

    async def wait_all_alive(self, deadline: float) -> bool:
        while time.time() < deadline:
            counts = await asyncio.to_thread(liveness_counts)
            if counts.get("alive", 0) == self.args.nodes:
                return True
            print(f"waiting for every node to be alive: {counts}", file=sys.stderr)
            await asyncio.sleep(5)
        return False

    async def run(self) -> dict:
        a = self.args
        await asyncio.to_thread(self.start_stack)
        fleet = Fleet("127.0.0.1", self.web_port, self.join_token, a.nodes, interval=a.interval)
        fleet_task = asyncio.create_task(fleet.run())
        try:
            started = time.time()
            while any(node.token is None for node in fleet.nodes) and time.time() < started + a.nodes:
                await asyncio.sleep(1)
            registered = sum(node.token is not None for node in fleet.nodes)
            outcomes = Counter((r.kind, r.status, r.error) for r in fleet.requests)
            print(f"registered {registered} nodes in {time.time() - started:.0f} s: {outcomes}", file=sys.stderr)
            warm = await self.wait_all_alive(time.time() + max(120, a.nodes / 20))
            counts = await asyncio.to_thread(liveness_counts)
            print(f"all alive before the outage: {warm} ({counts})", file=sys.stderr)

            stopped_at = time.time()
            # The web server behind the proxy goes; HAProxy stays and answers 503 meanwhile.
            await asyncio.to_thread(self.stack.stop, "web")
            print(f"web tier stopped for {a.outage:g} s", file=sys.stderr)
            most_unreachable = 0
            while time.time() < stopped_at + a.outage:
                counts = await asyncio.to_thread(liveness_counts)
                most_unreachable = max(most_unreachable, counts.get("unreachable", 0))
                await asyncio.sleep(1)
            await asyncio.to_thread(self.stack.start, self.stack.web_part(), 120)
            returned_at = time.time()
            marked_during_outage = await asyncio.to_thread(marked_unreachable_since, stopped_at)
            print(f"web tier back; {marked_during_outage} nodes were marked unreachable meanwhile", file=sys.stderr)

            all_alive_after = None
            while time.time() < returned_at + a.watch:
                counts = await asyncio.to_thread(liveness_counts)
                seconds = time.time() - returned_at
                alive, unreachable = counts.get("alive", 0), counts.get("unreachable", 0)
                self.timeline.append((round(seconds, 1), alive, unreachable))
                most_unreachable = max(most_unreachable, unreachable)
                if all_alive_after is None and alive == a.nodes:
                    all_alive_after = seconds
                await asyncio.sleep(1)
            flapped = await asyncio.to_thread(marked_unreachable_since, returned_at)
            after = [r for r in fleet.requests if r.kind == "heartbeat" and r.at >= returned_at]
            answered = sum(r.status == 200 for r in after)
        finally:
            fleet.stop()
            await fleet_task
            self.stack.stop_all()
            shutil.rmtree(self.var, ignore_errors=True)
        return {
            "registered": registered,
            "all_alive_after": all_alive_after,
            "marked_during_outage": marked_during_outage,
            "flapped": flapped,
            "most_unreachable": most_unreachable,
            "answered_after": answered,
            "sent_after": len(after),
            "latencies": sorted(r.seconds for r in after if r.status == 200),
            "timeline": self.timeline,
            "load": os.getloadavg()[0],
        }


def report(args: argparse.Namespace, result: dict) -> None:
    def figure(name: str, value, unit: str, target=None, better: str = "lower") -> dict:
        return {"name": name, "value": value, "unit": unit, "target": target, "better": better}

    alive_after = result["all_alive_after"]
    figures = [
        figure(
            f"every one of {args.nodes} nodes alive again after the web tier's {args.outage:g} s outage "
            f"(LLMGW_DISRUPTION_THRESHOLD={args.disruption_threshold:g})",
            round(alive_after, 1) if alive_after is not None else f"not within {args.watch:g} s",
            "s after its return",
            TARGET_SECONDS,
        ),
        figure("nodes marked unreachable during the outage", result["marked_during_outage"], "nodes", 0),
        figure("nodes marked unreachable after the return (flaps)", result["flapped"], "nodes", 0),
        figure("most nodes unreachable at once", result["most_unreachable"], "nodes"),
        figure(
            f"heartbeats answered in the {args.watch:g} s after the return",
            f"{result['answered_after']} of {result['sent_after']}",
            "",
            better="higher",
        ),
        figure("machine's load average (1 min) at the end", round(result["load"], 1), ""),
    ]
    latencies = result["latencies"]
    if latencies:
        for share in (0.5, 0.99):
            seconds = latencies[min(int(share * len(latencies)), len(latencies) - 1)]
            figures.append(figure(f"heartbeat p{share * 100:g} after the return", round(seconds, 3), "s"))
    for mark in (5, 10, 20, 30, 45, 60):
        alive = next((alive for seconds, alive, _ in result["timeline"] if seconds >= mark), None)
        if alive is not None:
            figures.append(figure(f"nodes alive {mark} s after the return", alive, "nodes", better="higher"))
    print("| figure | value | target |")
    print("| --- | --- | --- |")
    for f in figures:
        target = f"≤ {f['target']} {f['unit']}" if f["target"] is not None else ""
        print(f"| {f['name']} | {f['value']} {f['unit']} | {target} |")
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    # Both runs of the same fleet size are kept side by side: with the rule, and without it.
    out = RESULTS if args.disruption_threshold < 1 else RESULTS.with_name("recovery-revivals.json")
    out.write_text(json.dumps(figures, indent=2) + "\n")


def run_cases(args: argparse.Namespace) -> int:
    args.cases = list(disruptions.CASES) if args.cases == "all" else args.cases.split(",")
    unknown = set(args.cases) - set(disruptions.CASES)
    if unknown:
        print(f"unknown cases: {', '.join(sorted(unknown))} (known: {', '.join(disruptions.CASES)})", file=sys.stderr)
        return 2
    load_before = os.getloadavg()
    recovery = disruptions.Recovery(args)
    try:
        results = recovery.run()
    finally:
        recovery.stop()
    print("\n| case | back after | answered of due | answered/s degraded | worst p99 | not in time | failed | flaps |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for result in results:
        s = result["summary"]
        print(
            f"| {s['case']} | {s['back_after_s']} s | {s['answered']} of {s['due']} | "
            f"{s['answered_per_second_while_degraded']} of {s['due_per_second_while_degraded']} | "
            f"{s['worst_second_p99_ms']} ms | "
            f"{s['not_in_time']} | {s['failed']} | {s['flaps']} |"
        )
    out = RESULTS.with_name(f"recovery-cases-{args.nodes}.json")
    out.write_text(
        json.dumps(
            {
                "nodes": args.nodes,
                "interval": args.interval,
                "silence": args.silence,
                "watch": args.watch,
                "workers": args.workers,
                "load_average_before": load_before,
                "load_average_after": os.getloadavg(),
                "at": datetime.now(UTC).isoformat(timespec="seconds"),
                "cases": results,
            },
            indent=1,
        )
        + "\n"
    )
    return 0 if all(r["summary"]["flaps"] == 0 for r in results) else 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=10_000)
    parser.add_argument("--outage", type=float, default=120.0, help="seconds the web tier stays stopped")
    parser.add_argument("--watch", type=float, default=90.0, help="seconds watched after its return")
    parser.add_argument("--interval", type=float, default=5.0, help="heartbeat interval of every node")
    parser.add_argument("--workers", type=int, default=default_workers())
    parser.add_argument(
        "--disruption-threshold",
        type=float,
        default=0.55,
        help="LLMGW_DISRUPTION_THRESHOLD; 1 turns off the rule that marks nobody while no heartbeat arrives, "
        "so that the outage marks the whole fleet unreachable and the return measures its revival",
    )
    parser.add_argument(
        "--cases",
        help=f"comma-separated, or all: {', '.join(disruptions.CASES)} (instead of the web tier's outage)",
    )
    parser.add_argument("--silence", type=float, default=210.0, help="with --cases: seconds the partition lasts")
    parser.add_argument("--generators", type=int, default=2, help="with --cases: load generator processes")
    args = parser.parse_args()
    if args.cases:
        return run_cases(args)
    result = asyncio.run(Run(args).run())
    report(args, result)
    return 0 if result["all_alive_after"] is not None and result["flapped"] == 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
