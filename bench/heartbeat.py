"""A paced fleet of real-sized heartbeats against the stack as `make run` starts it, beside an empty Django view.

Starts the stack as `make run` does (HAProxy, granian with cores + 1 workers,
Celery worker and beat, Prometheus scraping /metrics every 15 s, its own
redis-server) on PostgreSQL, registers a fleet through the API with the soak's
machine classes, then beats it open loop (bench/fleetlib/pacer.py): every node
posts at its own interval with a random phase, carrying its load and the loads
and statuses of 2–4 engines, built with agent.protocol types. Slots the
generator could not send on time are counted, never skipped.

The run, in order, without a pause in the fleet's beating:

1. steady: the fleet at its interval (10,000 nodes at 5 s is 2,000/s): offered
   and answered rate, p50/p99 from each beat's due time, errors, CPU by process
   (HAProxy, the web server, Redis, Celery, PostgreSQL backends, Prometheus, the generator)
   from /proc/<pid>/stat, /metrics timed from here and by Prometheus
   (`scrape_duration_seconds`), and liveness events (false unreachable);
2. empty: the same fleet at the same rate posting to an empty Django view
   (routed only for this benchmark, LLMGW_BENCH_EMPTY_VIEW), short enough that
   no node is silent for LLMGW_UNREACHABLE_AFTER: what any Django request costs;
3. capacity: the interval shortened step by step (×1/1.25) until the answered
   rate stops following the offered one.

    python -m bench.heartbeat [--nodes 10000] [--seconds 60] [--no-capacity]
    python -m bench.heartbeat --nodes 1000 --seconds 20        # a quick run

Needs PostgreSQL at BENCH_POSTGRES (default postgres://postgres@127.0.0.1:5432),
where it recreates the database llmgw_bench_heartbeat, and prometheus on PATH.
"""

from __future__ import annotations

import argparse
import gzip
import http.client
import json
import math
import os
import random
import secrets
import shutil
import statistics
import sys
import tempfile
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import requests

from agent import protocol
from bench.fleetlib import bodies
from bench.fleetlib.cpu import Meter, postgres_backends, tree
from bench.fleetlib.pacer import HEARTBEAT, PacedFleet, Phase, PhaseStats, fleet_tails
from devstack import proxy
from devstack.polling import wait_until
from devstack.ports import free_port
from devstack.stack import Stack, default_workers

ROOT = Path(__file__).resolve().parent.parent

DATABASE = "llmgw_bench_heartbeat"
JOIN_TOKEN = "bench-join-token"
RESULTS = ROOT / "bench" / "results" / "heartbeat.json"
EMPTY = "/api/v1/bench-empty"
# What Prometheus 2.x sends when it scrapes.
PROMETHEUS_ACCEPT = (
    "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,"
    "text/plain;version=0.0.4;q=0.5,*/*;q=0.1"
)
GROUPS = ("proxy", "web", "redis", "celery", "postgres", "prometheus")


def recreate_database(server: str) -> str:
    import psycopg

    with psycopg.connect(f"{server}/postgres", autocommit=True) as connection:
        connection.execute(f"DROP DATABASE IF EXISTS {DATABASE} WITH (FORCE)")
        connection.execute(f"CREATE DATABASE {DATABASE}")
    return f"{server}/{DATABASE}"


_sessions = threading.local()


def register_fleet(base: str, nodes: int) -> list[tuple[str, bytes]]:
    """Register every node through the API, as agents would; each node's token and heartbeat body."""

    def register(index: int) -> tuple[str, bytes]:
        rng = random.Random(index)
        message, digest = bodies.registration(index, rng)
        if not hasattr(_sessions, "session"):
            _sessions.session = requests.Session()
        # As an agent does, a refusal that says when to come back (503 while the
        # database is unavailable, 429) is retried then, a few times.
        for _ in range(5):
            response = _sessions.session.post(
                f"{base}/api/v1/register",
                data=protocol.encode(message),
                headers={"Authorization": f"Bearer {JOIN_TOKEN}", "Content-Type": "application/json"},
                timeout=60,
            )
            if response.status_code not in (429, 503):
                break
            time.sleep(float(response.headers.get("Retry-After", 1)))
        response.raise_for_status()
        token = protocol.decode(response.content, protocol.Registered).token
        inventory = message.inventory
        return token, bodies.heartbeat(index, digest, inventory.host.cpus, inventory.memory_total_bytes, rng)

    with ThreadPoolExecutor(8) as pool:
        return list(pool.map(register, range(nodes)))


class MetricsProbe:
    """GET /metrics as Prometheus does (its Accept header, gzip) every few seconds, timed to the last byte."""

    def __init__(self, port: int, every: float = 5.0):
        self.port, self.every = port, every
        self.seconds: list[float] = []
        self.gzip_bytes = 0
        self.text_bytes = 0
        self.samples = 0
        self.failures = 0
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)

    def get(self) -> bytes | None:
        started = time.perf_counter()
        connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        try:
            connection.request("GET", "/metrics", headers={"Accept": PROMETHEUS_ACCEPT, "Accept-Encoding": "gzip"})
            response = connection.getresponse()
            body = response.read()
        except OSError:
            self.failures += 1
            return None
        finally:
            connection.close()
        if response.status != 200 or response.getheader("Content-Encoding") != "gzip":
            self.failures += 1
            return None
        self.seconds.append(time.perf_counter() - started)
        return body

    def run(self) -> None:
        while not self.stopping.wait(self.every):
            body = self.get()
            if body is not None and not self.gzip_bytes:
                self.gzip_bytes = len(body)
                text = gzip.decompress(body)  # several members when served from the render
                self.text_bytes = len(text)
                self.samples = sum(1 for line in text.splitlines() if line and not line.startswith(b"#"))

    def __enter__(self) -> MetricsProbe:
        if self.every > 0:
            self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stopping.set()
        if self.thread.is_alive():
            self.thread.join()


def prometheus_scrapes(port: int, since: float, until: float) -> dict:
    """What Prometheus measured of its scrapes of /metrics between two times."""
    window = max(int(until - since), 15)
    figures = {}
    for name, query in (
        ("max", f'max_over_time(scrape_duration_seconds{{job="llmgw"}}[{window}s])'),
        ("avg", f'avg_over_time(scrape_duration_seconds{{job="llmgw"}}[{window}s])'),
        ("count", f'count_over_time(scrape_duration_seconds{{job="llmgw"}}[{window}s])'),
        ("up", f'min_over_time(up{{job="llmgw"}}[{window}s])'),
        ("samples", 'scrape_samples_scraped{job="llmgw"}'),
    ):
        response = requests.get(
            f"http://127.0.0.1:{port}/api/v1/query", params={"query": query, "time": str(until)}, timeout=10
        )
        result = response.json()["data"]["result"]
        figures[name] = float(result[0]["value"][1]) if result else float("nan")
    return figures


def prometheus_rule_groups(port: int) -> dict[str, float]:
    """Seconds Prometheus' last evaluation of each rule group took, from its own /metrics."""
    text = requests.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text
    durations = {}
    for line in text.splitlines():
        if line.startswith("prometheus_rule_group_last_duration_seconds{"):
            labels, value = line.rsplit(" ", 1)
            group = labels.split('rule_group="', 1)[1].split('"', 1)[0]
            durations[group.rsplit(";", 1)[-1]] = float(value)
    return durations


def liveness_events(stack: Stack, since: float, until: float) -> dict:
    """Liveness changes between two times, nodes alive now."""
    script = (
        "import datetime, json; from inventory.models import Node, NodeEvent; "
        f"since = datetime.datetime.fromtimestamp({since}, datetime.UTC); "
        f"until = datetime.datetime.fromtimestamp({until}, datetime.UTC); "
        "events = NodeEvent.objects.filter(kind='liveness', at__gte=since, at__lt=until); "
        "print(json.dumps({'alive': Node.objects.filter(liveness='alive').count(), "
        "'changes': events.count(), 'unreachable': events.filter(to_state='unreachable').count()}))"
    )
    result = stack.manage("shell", "-c", script, capture=True)
    return json.loads(result.stdout.strip().splitlines()[-1])


class Run:
    """The stack, the fleet and the meter, and one measured phase at a time."""

    def __init__(self, stack: Stack, fleet: PacedFleet):
        self.stack, self.fleet = stack, fleet

        def pids(name: str) -> list[int]:
            """The part's pid, or none if the stack did not start it (Redis or Prometheus already running)."""
            part = stack.parts.get(name)
            return [part.pid] if part is not None else []

        self.meter = Meter(
            {
                "proxy": lambda: pids("proxy"),
                "web": lambda: tree(*pids("web")),
                "redis": lambda: pids("redis"),
                "celery": lambda: tree(*pids("celery")),
                "postgres": lambda: postgres_backends(DATABASE),
                "prometheus": lambda: pids("prometheus"),
                "generator": lambda: tree(*fleet.pids),
            }
        )

    def phase(self, phase: Phase) -> tuple[PhaseStats, dict[str, float], float, float]:
        before = self.meter.read()
        since = time.time()
        self.fleet.start(phase)
        time.sleep(phase.seconds)
        until = time.time()
        cpu = self.meter.since(before)
        return self.fleet.collect(phase.name), cpu, since, until


def summary(stats: PhaseStats, cpu: dict[str, float]) -> dict:
    latencies = sorted(stats.latencies)

    def percentile(p: float) -> float:
        return 1000 * latencies[min(int(p * len(latencies)), len(latencies) - 1)] if latencies else float("nan")

    # When the slow beats were due: one second at a time, the seconds with the most beats over 100 ms,
    # to tell a steady queue from a periodic stall (a render, a scrape, a sweep, a snapshot).
    slow_by_second: Counter = Counter()
    start = min(stats.due_times, default=0.0)
    for due, latency in zip(stats.due_times, stats.latencies, strict=True):
        if latency > 0.1:
            slow_by_second[int(due - start)] += 1
    # With nothing answered there is no cost per answer to give.
    answered = stats.answered or float("nan")
    return {
        "offered_per_second": stats.offered / stats.seconds,
        "answered_per_second": stats.answered / stats.seconds,
        "answered_share": 100 * stats.answered / max(stats.offered, 1),
        "p50_ms": percentile(0.50),
        "p99_ms": percentile(0.99),
        "errors": sum(stats.errors.values()) + sum(n for s, n in stats.statuses.items() if not 200 <= s < 300),
        "unsent": stats.unsent,
        "late": stats.late,
        "cpu_us": {name: 1e6 * seconds / answered for name, seconds in cpu.items()},
        # Cores each group kept busy through the phase, whatever it spent them on.
        "cores": {name: seconds / stats.seconds for name, seconds in cpu.items()},
        "generator_cores": stats.cpu_seconds / stats.seconds,
        "detail": {"statuses": dict(stats.statuses), "errors": dict(stats.errors)},
        "slow_beats": sum(slow_by_second.values()),
        "slowest_seconds": sorted(slow_by_second.most_common(8)),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=10_000)
    parser.add_argument("--seconds", type=int, default=60, help="steady phase (default 60)")
    parser.add_argument("--interval", type=float, default=5.0, help="each node's heartbeat interval (default 5)")
    parser.add_argument("--empty-seconds", type=int, default=15, help="the empty-view phase (keep it under 25)")
    parser.add_argument("--step-seconds", type=int, default=15, help="each capacity step")
    parser.add_argument("--no-capacity", action="store_true", help="skip stepping the rate up")
    parser.add_argument(
        "--probe-every", type=float, default=5.0, help="seconds between the benchmark's own /metrics GETs (0: none)"
    )
    parser.add_argument("--generators", type=int, default=2, help="load generator processes")
    parser.add_argument(
        "--workers", type=int, default=default_workers(), help="web workers (make run starts cores + 1)"
    )
    args = parser.parse_args()
    if shutil.which("prometheus") is None:
        print("prometheus is not installed: apt-get install prometheus", file=sys.stderr)
        return 1

    load_before = os.getloadavg()
    database_url = recreate_database(os.environ.get("BENCH_POSTGRES", "postgres://postgres@127.0.0.1:5432"))
    var = Path(tempfile.mkdtemp(prefix="llmgw-bench-heartbeat-"))
    stack = Stack(
        var,
        env={
            "DATABASE_URL": database_url,
            "REDIS_URL": f"redis://127.0.0.1:{free_port()}/0",
            "LLMGW_JOIN_TOKEN": JOIN_TOKEN,
            "LLMGW_BENCH_EMPTY_VIEW": "true",
            # As production runs it (docs/operations.md): DEBUG off, so its key and hosts are given;
            # no TLS on loopback, so no redirect to it.
            "DEBUG": "false",
            "SECRET_KEY": secrets.token_urlsafe(50),
            "ALLOWED_HOSTS": "127.0.0.1,localhost",
            "SECURE_SSL_REDIRECT": "false",
            # Plain HTTP on loopback, as no TLS is in front: tokens may cross it (nodes/entry.py).
            "LLMGW_REQUIRE_HTTPS": "false",
            # The whole simulated fleet registers from this one address.
            "LLMGW_REGISTER_PER_MINUTE": str(max(args.nodes * 2, 100)),
            # The capacity steps beat each node faster than an agent would.
            "LLMGW_HEARTBEAT_PER_MINUTE": "1200",
            # The whole fleet posts from 127.0.0.1: thirty 401s in a minute would
            # refuse every node for the rest of it, which no real fleet shares.
            "LLMGW_AUTH_FAILURES_PER_MINUTE": "1000000",
        },
        web_port=free_port(),
        prometheus_port=free_port(),
        workers=args.workers,
    )
    fleet = None
    results: dict = {"steps": []}
    try:
        stack.start(stack.redis_part())
        stack.prepare()
        stack.start_web()
        base = f"http://127.0.0.1:{stack.web_port}"
        started = time.monotonic()
        nodes = register_fleet(base, args.nodes)
        print(f"registered {len(nodes)} nodes in {time.monotonic() - started:.0f} s", file=sys.stderr)
        tails = fleet_tails("127.0.0.1", stack.web_port, nodes, proxy.max_connections())
        results["connections_kept"] = sum(b"Connection: close" not in tail for tail in tails)
        body_bytes = statistics.mean(len(body) for _, body in nodes)
        # The fleet beats from here on. The sweeper (Celery) starts once every
        # node has beaten, or the first registered would be marked unreachable
        # for the time it took to register the rest.
        fleet = PacedFleet("127.0.0.1", stack.web_port, tails, args.interval, workers=args.generators)
        run = Run(stack, fleet)
        beaten: set[int] = set()
        for _ in range(20):
            stats, *_ = run.phase(Phase("first beats", HEARTBEAT, args.interval, args.interval))
            beaten |= stats.nodes
            if len(beaten) == len(nodes):
                break
        results["beaten_before_sweeper"] = len(beaten)
        print(f"{len(beaten)} of {len(nodes)} nodes beat before the sweeper started", file=sys.stderr)
        stack.start(stack.celery_part())
        stack.start(stack.prometheus_part())
        prometheus = stack.prometheus_port

        def scraped() -> bool:
            answer = requests.get(
                f"http://127.0.0.1:{prometheus}/api/v1/query", params={"query": 'up{job="llmgw"}'}, timeout=5
            )
            # While it starts, Prometheus answers 503 with plain text.
            return answer.status_code == 200 and bool(answer.json()["data"]["result"])

        wait_until(scraped, 60, "Prometheus's first scrape of /metrics", interval=1)
        run.phase(Phase("warm-up", HEARTBEAT, args.interval, 10))

        with MetricsProbe(stack.web_port, args.probe_every) as probe:
            stats, cpu, since, until = run.phase(Phase("steady", HEARTBEAT, args.interval, args.seconds))
        results["steady"] = summary(stats, cpu)
        results["metrics"] = {
            "probe_seconds": probe.seconds,
            "gzip_bytes": probe.gzip_bytes,
            "text_bytes": probe.text_bytes,
            "samples": probe.samples,
            "failures": probe.failures,
            "prometheus": prometheus_scrapes(prometheus, since, until),
            "rule_groups": prometheus_rule_groups(prometheus),
        }
        stats, cpu, _, _ = run.phase(Phase("empty", EMPTY, args.interval, args.empty_seconds))
        results["empty"] = summary(stats, cpu)
        # The sweep that would notice a node silent during steady or empty runs within a beat period.
        run.phase(Phase("settle", HEARTBEAT, args.interval, 10))
        results["fleet"] = liveness_events(stack, since, time.time())

        # Up from the fleet's rate while it is held; down from it, with longer
        # intervals (still well inside LLMGW_UNREACHABLE_AFTER), while it is not.
        steady_held = results["steady"]["answered_per_second"] >= 0.95 * results["steady"]["offered_per_second"]
        factor = 1 / 1.25 if steady_held else 1.25
        interval = args.interval
        while not args.no_capacity and len(results["steps"]) < (8 if steady_held else 5):
            interval *= factor
            step_phase = Phase(f"step {interval:.2f}s", HEARTBEAT, interval, args.step_seconds)
            stats, cpu, _, _ = run.phase(step_phase)
            step = summary(stats, cpu)
            results["steps"].append(step)
            print(
                f"step: offered {step['offered_per_second']:.0f}/s, answered {step['answered_per_second']:.0f}/s, "
                f"p99 {step['p99_ms']:.0f} ms",
                file=sys.stderr,
            )
            held = step["answered_per_second"] >= 0.95 * step["offered_per_second"] and not step["unsent"]
            if held != steady_held:
                break
    finally:
        if fleet is not None:
            fleet.close()
        stack.stop_all()
        shutil.rmtree(var, ignore_errors=True)

    results["load_average"] = (load_before[0], os.getloadavg()[0])
    report(results, args, body_bytes)
    return 0


def report(results: dict, args: argparse.Namespace, body_bytes: float) -> None:
    steady, empty, metrics, fleet = results["steady"], results["empty"], results["metrics"], results["fleet"]
    probe = metrics["probe_seconds"]
    web_ratio = steady["cpu_us"]["web"] / empty["cpu_us"]["web"]
    capacity = max([steady["answered_per_second"], *(s["answered_per_second"] for s in results["steps"])])
    control_plane = sum(steady["cpu_us"][g] for g in GROUPS)
    figures = [
        ("nodes", args.nodes, "nodes", None, "higher"),
        ("heartbeat_body_bytes", body_bytes, "bytes", None, "lower"),
        ("heartbeats_offered_per_second", steady["offered_per_second"], "1/s", None, "higher"),
        ("heartbeats_answered_per_second", steady["answered_per_second"], "1/s", None, "higher"),
        ("heartbeats_answered_share", steady["answered_share"], "%", 99.9, "higher"),
        ("heartbeat_p50_latency", steady["p50_ms"], "ms", None, "lower"),
        ("heartbeat_p99_latency", steady["p99_ms"], "ms", 100, "lower"),
        ("heartbeat_errors", steady["errors"], "requests", 0, "lower"),
        ("heartbeat_slots_unsent", steady["unsent"], "slots", 0, "lower"),
        ("heartbeat_slots_sent_late", steady["late"], "slots", 0, "lower"),
        ("false_unreachable_transitions", fleet["unreachable"], "events", 0, "lower"),
        ("liveness_changes_while_measuring", fleet["changes"], "events", 0, "lower"),
        ("nodes_alive_after_steady", fleet["alive"], "nodes", args.nodes, "higher"),
        ("nodes_beaten_before_sweeper", results["beaten_before_sweeper"], "nodes", args.nodes, "higher"),
        *((f"heartbeat_{group}_cpu_per_request", steady["cpu_us"][group], "µs", None, "lower") for group in GROUPS),
        ("heartbeat_control_plane_cpu_per_request", control_plane, "µs", None, "lower"),
        ("empty_view_answered_per_second", empty["answered_per_second"], "1/s", None, "higher"),
        ("empty_view_p50_latency", empty["p50_ms"], "ms", None, "lower"),
        ("empty_view_p99_latency", empty["p99_ms"], "ms", None, "lower"),
        ("empty_view_web_cpu_per_request", empty["cpu_us"]["web"], "µs", None, "lower"),
        ("heartbeat_web_cpu_over_empty_view", web_ratio, "×", 1.5, "lower"),
        ("capacity_heartbeats_per_second", capacity, "1/s", 2000, "higher"),
        ("metrics_get_median_seconds", statistics.median(probe) if probe else float("nan"), "s", 1, "lower"),
        ("metrics_get_max_seconds", max(probe) if probe else float("nan"), "s", 1, "lower"),
        ("metrics_scrape_max_seconds_prometheus", metrics["prometheus"]["max"], "s", 1, "lower"),
        ("metrics_scrape_avg_seconds_prometheus", metrics["prometheus"]["avg"], "s", None, "lower"),
        ("metrics_samples", metrics["samples"], "samples", None, "lower"),
        ("metrics_gzip_bytes", metrics["gzip_bytes"], "bytes", None, "lower"),
        ("metrics_text_bytes", metrics["text_bytes"], "bytes", None, "lower"),
        ("load_generator_cpu", steady["generator_cores"], "cores", None, "lower"),
        ("load_average_before", results["load_average"][0], "", None, "lower"),
        ("load_average_after", results["load_average"][1], "", None, "lower"),
    ]
    print(
        f"\n{args.nodes} nodes every {args.interval:g} s, {args.workers} web workers, "
        f"{results['connections_kept']} nodes keeping their connection between beats (the rest connect each beat), "
        f"{args.generators} generator processes, steady {args.seconds} s, empty view {args.empty_seconds} s; "
        f"load average {results['load_average'][0]:.1f} before, {results['load_average'][1]:.1f} after\n"
    )
    print("| figure | value | unit | target |")
    print("| --- | ---: | --- | ---: |")
    for name, value, unit, target, better in figures:
        goal = "" if target is None else f"{'≥' if better == 'higher' else '≤'} {target}"
        print(f"| {name} | {value:,.{1 if abs(value) >= 10 else 3}f} | {unit} | {goal} |")
    print("\nSteady, then the capacity steps; the cores each part kept busy:\n")
    groups = (*GROUPS, "generator")
    print("| offered /s | answered /s | p50 ms | p99 ms | unsent | errors | web µs | " + " | ".join(groups) + " |")
    print("| ---: " * (7 + len(groups)) + "|")
    for s in [steady, *results["steps"]]:
        print(
            f"| {s['offered_per_second']:.0f} | {s['answered_per_second']:.0f} | {s['p50_ms']:.1f} | "
            f"{s['p99_ms']:.1f} | {s['unsent']} | {s['errors']} | {s['cpu_us']['web']:.0f} | "
            + " | ".join(f"{s['cores'][g]:.2f}" for g in groups)
            + " |"
        )
    print(f"\nsteady: {json.dumps(steady['detail'])}; empty: {json.dumps(empty['detail'])}")
    for name, phase in (("steady", steady), ("empty", empty)):
        print(
            f"{name}: {phase['slow_beats']} beats over 100 ms; the seconds (from the phase's start) with most of them, "
            f"[second, beats]: {phase['slowest_seconds']}"
        )
    print(f"prometheus: {json.dumps(metrics['prometheus'])}; probe: {[round(s, 3) for s in probe]}")
    print(f"prometheus rule groups, seconds per evaluation: {json.dumps(metrics['rule_groups'])}")
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(
        json.dumps(
            [
                # A figure that could not be measured (nothing answered) is null, never NaN, which JSON lacks.
                {
                    "name": name,
                    "value": round(value, 3) if math.isfinite(value) else None,
                    "unit": unit,
                    "target": target,
                    "better": better,
                }
                for name, value, unit, target, better in figures
            ],
            indent=2,
        )
        + "\n"
    )


if __name__ == "__main__":
    sys.exit(main())
