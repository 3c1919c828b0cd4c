"""Benchmark /metrics at 1,000 and 10,000 nodes (8 GPUs and 4 shards each).

For each size: a real web worker (one granian worker, so every scrape hits the
same process) serves /metrics over HTTP from a SQLite database and a private
redis-server; the scrape's wall time, its size and the worker's resident
memory are measured over several scrapes. Beside it, in the same run and on
the same series: the time prometheus_client itself takes to serialise a
registry holding those series already built (its families parsed from the
scrape), which is the floor of any collector that builds sample objects.

The scrape is timed by curl (time to the first byte, when every query and the
Redis round trip are done, and in all) with the Accept and Accept-Encoding
headers Prometheus sends, so it is gzipped and unpacked as Prometheus'.
CPU seconds (the worker's, and prometheus_client's) are given beside wall
seconds: on a machine shared with other work they move far less.

Run alone: .venv/bin/python -m bench.metrics [--sizes 1000,10000] [--scrapes 15] [--database-url URL]
Prints a Markdown table and writes bench/results/metrics.json.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

TARGET_SECONDS = 1.0
# What Prometheus 2.42 sends; prometheus_client answers it with OpenMetrics.
PROMETHEUS_ACCEPT = (
    "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,"
    "text/plain;version=0.0.4;q=0.5,*/*;q=0.1"
)


def setup_django(var: Path, redis_url: str, database_url: str | None) -> dict[str, str]:
    env = {
        "DATABASE_URL": database_url or f"sqlite:///{var / 'bench.sqlite3'}",
        "LLMGW_VAR_DIR": str(var),
        "REDIS_URL": redis_url,
        "DEBUG": "false",
        "SECRET_KEY": "bench-only-not-a-secret",
        "ALLOWED_HOSTS": "127.0.0.1,localhost",
        "SECURE_SSL_REDIRECT": "false",
    }
    os.environ.update(env)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "llmgw_site.settings")
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    return env


def fetch(url: str, into: Path) -> tuple[float, float, int]:
    """(seconds to the first byte, seconds in all, bytes sent) of one scrape by curl, a client as quick
    as Prometheus' own, asking for gzip as Prometheus does (and unpacking it, as Prometheus does)."""
    result = subprocess.run(
        [
            "curl",
            "-sf",
            "--compressed",
            "-H",
            f"Accept: {PROMETHEUS_ACCEPT}",
            "-o",
            str(into),
            "-w",
            "%{time_starttransfer} %{time_total} %{size_download}",
            url,
        ],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    first, total, sent = result.stdout.split()
    return float(first), float(total), int(sent)


def render_microseconds(runs: int = 20_000) -> float:
    """What a heartbeat pays to render its load (4 shards) for /metrics."""
    from livestate import loadlines
    from tests import factories

    load = factories.load_of("node-00042")
    started = time.perf_counter()
    for _ in range(runs):
        loadlines.render("node-00042", load, 1.0)
    return (time.perf_counter() - started) / runs * 1e6


def rss(process) -> tuple[int, int]:
    """(current, peak) resident bytes of a process, from /proc."""
    status = Path(f"/proc/{process.pid}/status").read_text().splitlines()
    values = {line.split(":")[0]: int(line.split()[1]) * 1024 for line in status if line.startswith(("VmRSS", "VmHWM"))}
    return values["VmRSS"], values["VmHWM"]


def cpu_seconds(process) -> float:
    """CPU time the process used so far: unlike wall time, barely moved by other work on a busy machine."""
    times = process.cpu_times()
    return times.user + times.system


def prometheus_client_floor(text: str, runs: int) -> dict[str, tuple[float, float]]:
    """Median (wall, CPU) seconds prometheus_client takes to write a pre-built registry of the same
    series, in OpenMetrics (what Prometheus asks for, and what the scrape answered) and in the text format."""
    from prometheus_client import CollectorRegistry
    from prometheus_client.exposition import generate_latest as text_format
    from prometheus_client.openmetrics.exposition import generate_latest as openmetrics
    from prometheus_client.openmetrics.parser import text_string_to_metric_families

    built = list(text_string_to_metric_families(text))

    class Prebuilt:
        def collect(self):
            return built

    registry = CollectorRegistry(auto_describe=False)
    registry.register(Prebuilt())
    floors = {}
    for name, encoder in (("openmetrics", openmetrics), ("text", text_format)):
        times, cpu = [], []
        for _ in range(runs):
            started, used = time.perf_counter(), time.process_time()
            encoder(registry)
            times.append(time.perf_counter() - started)
            cpu.append(time.process_time() - used)
        floors[name] = statistics.median(times), statistics.median(cpu)
    return floors


def measure(size: int, env: dict[str, str], var: Path, scrapes: int) -> list[dict]:
    import psutil

    from devstack.ports import free_port
    from devstack.stack import Stack
    from inventory.models import Node
    from tests import factories

    Node.objects.all().delete()
    started = time.perf_counter()
    ids = factories.build(size, at=time.time())
    built = time.perf_counter() - started

    stack = Stack(var / f"stack-{size}", env=env, web_port=free_port(), workers=1)
    stack.start_web()
    try:
        master = psutil.Process(stack.parts["web"].pid)
        worker = master.children()[0]
        url = f"http://127.0.0.1:{stack.web_port}/metrics"
        output = var / f"scrape-{size}.txt"
        # Any request loads the URLconf and with it every module /metrics uses.
        subprocess.run(["curl", "-sf", "-o", "/dev/null", f"http://127.0.0.1:{stack.web_port}/healthz"], check=True)
        idle_rss, _ = rss(worker)
        # Fresh loads for every node, saved as the heartbeats would, just before the scrapes.
        started = time.perf_counter()
        factories.save_loads(ids, time.time())
        saved = time.perf_counter() - started
        # A worker's first scrape renders every inventory row; later ones reuse the unchanged rows.
        _, cold, _ = fetch(url, output)
        times, first_bytes, cpu, after = [], [], [], []
        for _ in range(scrapes):
            used = cpu_seconds(worker)
            first_byte, seconds, sent = fetch(url, output)
            cpu.append(cpu_seconds(worker) - used)
            times.append(seconds)
            first_bytes.append(first_byte)
            after.append(rss(worker)[0])
        text = output.read_text()
        peak = rss(worker)[1]
    finally:
        stack.stop_all()
    series = sum(1 for line in text.splitlines() if line and not line.startswith("#"))
    shard_series = text.count("\nllmgw_shard_cpu_cores{")
    assert shard_series == 4 * size, f"expected {4 * size} fresh shard series, found {shard_series}"
    floors = prometheus_client_floor(text, 3)
    print(f"  {size} nodes: fleet built in {built:.1f} s, loads saved in {saved:.2f} s", file=sys.stderr)
    mib = 2**20
    return [
        figure(f"scrape_seconds_{size}", statistics.median(times), "s", TARGET_SECONDS if size == 10_000 else None),
        figure(f"scrape_first_byte_seconds_{size}", statistics.median(first_bytes), "s"),
        figure(f"first_scrape_of_a_worker_seconds_{size}", cold, "s"),
        figure(f"scrape_worker_cpu_seconds_{size}", statistics.median(cpu), "s"),
        figure(f"prometheus_client_openmetrics_seconds_{size}", floors["openmetrics"][0], "s"),
        figure(f"prometheus_client_openmetrics_cpu_seconds_{size}", floors["openmetrics"][1], "s"),
        figure(f"prometheus_client_text_seconds_{size}", floors["text"][0], "s"),
        figure(f"prometheus_client_text_cpu_seconds_{size}", floors["text"][1], "s"),
        figure(f"series_{size}", series, "series", better="higher"),
        figure(f"scrape_bytes_{size}", len(text.encode()), "bytes"),
        figure(f"scrape_bytes_gzipped_{size}", sent, "bytes"),
        figure(f"worker_rss_before_mib_{size}", idle_rss / mib, "MiB"),
        figure(f"worker_rss_after_scrapes_max_mib_{size}", max(after) / mib, "MiB"),
        # Bounded: what the second half of the scrapes added to the most the first half reached.
        figure(
            f"worker_rss_growth_second_half_mib_{size}",
            (max(after) - max(after[: len(after) // 2])) / mib,
            "MiB",
        ),
        figure(f"worker_peak_rss_mib_{size}", peak / mib, "MiB"),
        figure(f"load_save_microseconds_{size}", saved / size * 1e6, "µs"),
    ]


def figure(name: str, value: float, unit: str, target: float | None = None, better: str = "lower") -> dict:
    return {"name": name, "value": round(value, 4), "unit": unit, "target": target, "better": better}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1000,10000")
    parser.add_argument("--scrapes", type=int, default=15)
    parser.add_argument(
        "--database-url",
        help="an existing database to fill (its nodes are deleted first); default: SQLite in a temporary directory",
    )
    args = parser.parse_args()

    from devstack.redis_server import RedisServer

    if shutil.which("curl") is None:
        print("bench/metrics.py needs curl: apt-get install curl", file=sys.stderr)
        return 1

    with tempfile.TemporaryDirectory(prefix="llmgw-bench-metrics-") as tmp:
        var = Path(tmp)
        redis_server = RedisServer(var / "redis").start()
        try:
            env = setup_django(var, redis_server.url, args.database_url)
            results = [figure("heartbeat_render_microseconds", render_microseconds(), "µs")]
            for size in (int(s) for s in args.sizes.split(",")):
                results += measure(size, env, var, args.scrapes)
        finally:
            redis_server.stop()

    print("| figure | value | unit | target |")
    print("| --- | ---: | --- | ---: |")
    for r in results:
        print(f"| {r['name']} | {r['value']} | {r['unit']} | {'' if r['target'] is None else r['target']} |")
    # Another database's figures go beside the default run's, named by its scheme (metrics-postgres.json).
    suffix = f"-{args.database_url.split(':', 1)[0]}" if args.database_url else ""
    out = ROOT / "bench" / "results" / f"metrics{suffix}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
