"""The cluster page timed over HTTP while a paced fleet beats beside it: `python -m bench.pages --beside-fleet`.

The stack starts as `make run` starts it (HAProxy, granian with cores + 1
workers, Celery worker and beat, Prometheus, its own redis-server) on
PostgreSQL, as bench/heartbeat.py starts it; the fleet registers through the
API and beats open loop at its interval (bench/fleetlib/pacer.py). While it
beats, an operator's session asks for the cluster page filtered, sorted by CPU
and paged (PAGE_URL, the URL issue 25 measured), whole and as its htmx
partial, in turn, one request every `every` seconds: each timed from here to
its last byte, through HAProxy. The fleet's answered rate and p99 over the
same seconds say whether the pages slowed the beats.
"""

from __future__ import annotations

import http.client
import random
import secrets
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

from bench.fleetlib.pacer import HEARTBEAT, PacedFleet, Phase, fleet_tails
from devstack import proxy
from devstack.ports import free_port
from devstack.stack import Stack, default_workers

DATABASE = "llmgw_bench_pages_fleet"
JOIN_TOKEN = "bench-join-token"
PAGE_URL = "/?state=ready&sort=-cpu&page=3"
# What issue 25 set: the page's median and slowest request while 10,000 nodes beat at 2,000/s.
TARGET_MEDIAN_MS = 150
TARGET_MAX_MS = 300

SESSION_SCRIPT = """
from django.contrib.auth.models import User
from django.test import Client
user, _ = User.objects.get_or_create(username="bench-viewer")
client = Client()
client.force_login(user)
print("SESSION", client.cookies["sessionid"].value)
"""


def recreate_database(server: str) -> str:
    import psycopg

    with psycopg.connect(f"{server}/postgres", autocommit=True) as connection:
        connection.execute(f"DROP DATABASE IF EXISTS {DATABASE} WITH (FORCE)")
        connection.execute(f"CREATE DATABASE {DATABASE}")
    return f"{server}/{DATABASE}"


def session_cookie(stack: Stack) -> str:
    """A logged-in viewer's session id, made the way a login makes one."""
    out = stack.manage("shell", "-c", SESSION_SCRIPT, capture=True).stdout
    return next(line.split()[1] for line in out.splitlines() if line.startswith("SESSION "))


def timed_get(port: int, path: str, cookie: str, htmx: bool) -> float:
    """Milliseconds to the last byte of a GET through the proxy; fails on anything but 200."""
    headers = {"Cookie": f"sessionid={cookie}"}
    if htmx:
        headers["HX-Request"] = "true"
    started = time.perf_counter()
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        connection.request("GET", path, headers=headers)
        response = connection.getresponse()
        body = response.read()
    finally:
        connection.close()
    took = 1000 * (time.perf_counter() - started)
    if response.status != 200 or b'id="node-' not in body:
        raise RuntimeError(f"GET {path}: {response.status} {body[:300]!r}")
    return took


def measure(args) -> dict:
    """Run the stack and the fleet, time the page beside it; the figures."""
    from bench.heartbeat import register_fleet

    server = args.postgres
    database_url = recreate_database(server)
    var = Path(tempfile.mkdtemp(prefix="llmgw-bench-pages-fleet-"))
    stack = Stack(
        var,
        env={
            "DATABASE_URL": database_url,
            "REDIS_URL": f"redis://127.0.0.1:{free_port()}/0",
            "LLMGW_JOIN_TOKEN": JOIN_TOKEN,
            "DEBUG": "false",
            "SECRET_KEY": secrets.token_urlsafe(50),
            "ALLOWED_HOSTS": "127.0.0.1,localhost",
            "SECURE_SSL_REDIRECT": "false",
            # No TLS on loopback, as bench.heartbeat's stack: a credential over plain HTTP is refused otherwise.
            "LLMGW_REQUIRE_HTTPS": "false",
            "LLMGW_REGISTER_PER_MINUTE": str(max(args.nodes * 2, 100)),
            "LLMGW_AUTH_FAILURES_PER_MINUTE": "1000000",
        },
        web_port=free_port(),
        prometheus_port=free_port(),
        workers=args.workers or default_workers(),
    )
    fleet = None
    try:
        stack.start(stack.redis_part())
        stack.prepare()
        stack.start_web()
        started = time.monotonic()
        nodes = register_fleet(f"http://127.0.0.1:{stack.web_port}", args.nodes)
        print(f"registered {len(nodes)} nodes in {time.monotonic() - started:.0f} s", file=sys.stderr)
        tails = fleet_tails("127.0.0.1", stack.web_port, nodes, proxy.max_connections())
        fleet = PacedFleet("127.0.0.1", stack.web_port, tails, args.interval, workers=args.generators)
        # Every node beats once before the sweeper starts, as bench/heartbeat.py does.
        fleet.start(Phase("first beats", HEARTBEAT, args.interval, args.interval))
        fleet.collect("first beats")
        stack.start(stack.celery_part())
        stack.start(stack.prometheus_part())
        cookie = session_cookie(stack)
        fleet.start(Phase("warm-up", HEARTBEAT, args.interval, 10))
        for _ in range(3):
            timed_get(stack.web_port, PAGE_URL, cookie, False)
        fleet.collect("warm-up")

        fleet.start(Phase("pages", HEARTBEAT, args.interval, args.seconds))
        page: list[float] = []
        partial: list[float] = []
        rng = random.Random(0)
        deadline = time.monotonic() + args.seconds - 1
        while time.monotonic() < deadline:
            page.append(timed_get(stack.web_port, PAGE_URL, cookie, False))
            time.sleep(args.every * rng.uniform(0.5, 1.5))
            partial.append(timed_get(stack.web_port, PAGE_URL, cookie, True))
            time.sleep(args.every * rng.uniform(0.5, 1.5))
        beats = fleet.collect("pages")
    finally:
        if fleet is not None:
            fleet.close()
        stack.stop_all()
        shutil.rmtree(var, ignore_errors=True)
    latencies = sorted(beats.latencies)
    return {
        "page": page,
        "partial": partial,
        "offered_per_second": beats.offered / beats.seconds,
        "answered_per_second": beats.answered / beats.seconds,
        "beat_p99_ms": 1000 * latencies[int(0.99 * (len(latencies) - 1))] if latencies else float("nan"),
        "unsent": beats.unsent,
    }


def figures(args, result: dict) -> list[dict]:
    """The benchmark's figures, as bench/results/*.json hold them."""
    label = f"{args.nodes:,}".replace(",", "_")
    at_target_size = args.nodes >= 10_000
    rows = []
    for name in ("page", "partial"):
        times = result[name]
        rows.append((f"cluster_{name}_beside_fleet_{label}_median", statistics.median(times), TARGET_MEDIAN_MS))
        rows.append((f"cluster_{name}_beside_fleet_{label}_max", max(times), TARGET_MAX_MS))
    out = [
        {"name": n, "value": round(v, 1), "unit": "ms", "target": t if at_target_size else None, "better": "lower"}
        for n, v, t in rows
    ]
    out += [
        {"name": f"fleet_{label}_offered_per_second", "value": round(result["offered_per_second"], 1), "unit": "1/s"},
        {"name": f"fleet_{label}_answered_per_second", "value": round(result["answered_per_second"], 1), "unit": "1/s"},
        {"name": f"fleet_{label}_beat_p99", "value": round(result["beat_p99_ms"], 1), "unit": "ms"},
        {"name": f"fleet_{label}_slots_unsent", "value": result["unsent"], "unit": "slots"},
    ]
    for row in out[len(rows) :]:
        row.update({"target": None, "better": "higher" if "answered" in row["name"] else "lower"})
    return out
