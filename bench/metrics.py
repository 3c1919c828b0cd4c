"""Benchmark /metrics at 1,000 and 10,000 nodes (8 GPUs and 4 shards each).

For each size: a real gunicorn worker (one, so every scrape hits the same
process) serves /metrics over HTTP from a SQLite database and a private
redis-server; the scrape's wall time, its size and the worker's resident
memory are measured over several scrapes. Beside it, in the same run and on
the same series: the time prometheus_client itself takes to serialise a
registry holding those series already built (its families parsed from the
scrape), which is the floor of any collector that builds sample objects.

Run alone: .venv/bin/python bench/metrics.py [--sizes 1000,10000] [--scrapes 7]
Prints a Markdown table and writes bench/results/metrics.json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

TARGET_SECONDS = 1.0


def setup_django(var: Path, redis_url: str) -> dict[str, str]:
    env = {
        "DATABASE_URL": f"sqlite:///{var / 'bench.sqlite3'}",
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


def fetch(url: str) -> tuple[bytes, float]:
    request = urllib.request.Request(url, headers={"Accept": "text/plain; version=0.0.4"})
    started = time.perf_counter()
    with urllib.request.urlopen(request, timeout=60) as response:
        data = response.read()
    return data, time.perf_counter() - started


def rss(process) -> tuple[int, int]:
    """(current, peak) resident bytes of a process, from /proc."""
    status = Path(f"/proc/{process.pid}/status").read_text().splitlines()
    values = {line.split(":")[0]: int(line.split()[1]) * 1024 for line in status if line.startswith(("VmRSS", "VmHWM"))}
    return values["VmRSS"], values["VmHWM"]


def prometheus_client_floor(text: str, runs: int) -> float:
    """Median time of prometheus_client's generate_latest over a registry with the same series, pre-built."""
    from prometheus_client import CollectorRegistry, generate_latest
    from prometheus_client.parser import text_string_to_metric_families

    built = list(text_string_to_metric_families(text))

    class Prebuilt:
        def collect(self):
            return built

    registry = CollectorRegistry(auto_describe=False)
    registry.register(Prebuilt())
    times = []
    for _ in range(runs):
        started = time.perf_counter()
        generate_latest(registry)
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def measure(size: int, env: dict[str, str], var: Path, scrapes: int) -> list[dict]:
    import psutil

    from inventory.models import Node
    from scripts.stack import Stack
    from tests import fleet
    from tests.services import free_port

    Node.objects.all().delete()
    started = time.perf_counter()
    ids = fleet.build(size, at=time.time())
    built = time.perf_counter() - started

    stack = Stack(var / f"stack-{size}", env=env, web_port=free_port(), workers=1)
    stack.start(stack.web_part())
    try:
        master = psutil.Process(stack.parts["web"].process.pid)
        worker = master.children()[0]
        url = f"http://127.0.0.1:{stack.web_port}/metrics"
        fetch(url)  # warm-up: imports, first connection
        idle_rss, _ = rss(worker)
        # Fresh loads for every node, saved as the heartbeats would, just before the scrapes.
        started = time.perf_counter()
        fleet.save_loads(ids, time.time())
        saved = time.perf_counter() - started
        times, sizes, after = [], [], []
        for _ in range(scrapes):
            data, seconds = fetch(url)
            times.append(seconds)
            sizes.append(len(data))
            after.append(rss(worker)[0])
        text = data.decode()
        series = sum(1 for line in text.splitlines() if line and not line.startswith("#"))
        shard_series = text.count("\nllmgw_shard_cpu_cores{")
        assert shard_series == 4 * size, f"expected {4 * size} fresh shard series, found {shard_series}"
        peak = rss(worker)[1]
    finally:
        stack.stop_all()
    floor = prometheus_client_floor(text, max(3, scrapes // 2))
    scrape = statistics.median(times)
    print(
        f"  {size} nodes: fleet built in {built:.1f} s, {size} loads saved in {saved:.2f} s "
        f"({saved / size * 1e6:.0f} µs each, rendering included)",
        file=sys.stderr,
    )
    return [
        {
            "name": f"scrape_seconds_{size}",
            "value": round(scrape, 4),
            "unit": "s",
            "target": TARGET_SECONDS if size == 10_000 else None,
            "better": "lower",
        },
        {
            "name": f"prometheus_client_serialise_seconds_{size}",
            "value": round(floor, 4),
            "unit": "s",
            "target": None,
            "better": "lower",
        },
        {"name": f"series_{size}", "value": series, "unit": "series", "target": None, "better": "higher"},
        {
            "name": f"scrape_bytes_{size}",
            "value": statistics.median(sizes),
            "unit": "bytes",
            "target": None,
            "better": "lower",
        },
        {
            "name": f"worker_rss_idle_mib_{size}",
            "value": round(idle_rss / 2**20, 1),
            "unit": "MiB",
            "target": None,
            "better": "lower",
        },
        {
            "name": f"worker_rss_after_scrapes_mib_{size}",
            "value": round(max(after) / 2**20, 1),
            "unit": "MiB",
            "target": None,
            "better": "lower",
        },
        {
            "name": f"worker_rss_growth_last_vs_first_scrape_mib_{size}",
            "value": round((after[-1] - after[0]) / 2**20, 1),
            "unit": "MiB",
            "target": None,
            "better": "lower",
        },
        {
            "name": f"worker_peak_rss_mib_{size}",
            "value": round(peak / 2**20, 1),
            "unit": "MiB",
            "target": None,
            "better": "lower",
        },
        {
            "name": f"load_save_microseconds_{size}",
            "value": round(saved / size * 1e6, 1),
            "unit": "µs",
            "target": None,
            "better": "lower",
        },
    ]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1000,10000")
    parser.add_argument("--scrapes", type=int, default=7)
    args = parser.parse_args()

    from tests.services import RedisServer

    with tempfile.TemporaryDirectory(prefix="llmgw-bench-metrics-") as tmp:
        var = Path(tmp)
        redis_server = RedisServer(var / "redis").start()
        try:
            env = setup_django(var, redis_server.url)
            results = []
            for size in (int(s) for s in args.sizes.split(",")):
                results += measure(size, env, var, args.scrapes)
        finally:
            redis_server.stop()

    print("| figure | value | unit | target |")
    print("| --- | ---: | --- | ---: |")
    for r in results:
        print(f"| {r['name']} | {r['value']} | {r['unit']} | {'' if r['target'] is None else r['target']} |")
    out = ROOT / "bench" / "results" / "metrics.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
