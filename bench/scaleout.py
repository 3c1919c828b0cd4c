"""Two web instances behind HAProxy, one killed under a simulated fleet's load: nothing lost, no state changed.

    python -m bench.scaleout [--nodes 2000] [--interval 5] [--seconds 60]     # make bench
    python -m bench.scaleout --nodes 200 --interval 2 --seconds 30 \\
        --unreachable-after 10 --private-postgres --out DIR                  # tests/test_proxy_scaleout.py

The stack starts as `make run` starts it (devstack.stack) but with two granian
instances on their own ports, as two web hosts would be, sharing one PostgreSQL and
one Redis, behind the same HAProxy (deploy/haproxy.cfg). A simulated fleet
(bench/soaklib/fleet.py, the real protocol) beats through the proxy and, like the
agent (agent/loop.py), retries a failed heartbeat once after a backoff of up to a
second. A third of the way through the measured window the second instance is
killed (SIGKILL, its requests in flight with it); at two thirds it is started
again. The run checks that no heartbeat failed its retry too, that no node changed
liveness, and that the only heartbeats failing even their first try were those the
killed instance held when it died (502): HAProxy resends a request whose connection
was refused to the other instance, and only such a request, since a POST that
reached a worker must not be sent twice.

Writes bench/results/scaleout.json (or OUT/scaleout.json). Needs PostgreSQL at
BENCH_POSTGRES (default postgres://postgres@127.0.0.1:5432), where it recreates the
database llmgw_bench_scaleout, or --private-postgres; and haproxy.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import secrets
import shutil
import signal
import statistics
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import psutil
import psycopg

from bench.soaklib.fleet import Fleet, SimNode
from bench.soaklib.postgres import PrivatePostgres, SharedPostgres
from devstack import proxy
from devstack.polling import wait_until
from devstack.ports import free_port, port_open
from devstack.stack import Stack

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"
# agent/loop.py's first backoff after a failed heartbeat: uniform up to backoff_base (1 s).
AGENT_FIRST_BACKOFF = 1.0
KILLED = "web-1"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=2000)
    parser.add_argument("--interval", type=float, default=5.0, help="heartbeat interval, seconds")
    parser.add_argument("--seconds", type=float, default=60.0, help="measured window; the kill is at a third")
    parser.add_argument("--workers", type=int, default=2, help="web workers per instance")
    parser.add_argument("--unreachable-after", type=float, default=30.0)
    parser.add_argument("--beat-period", type=float, default=2.0, help="seconds between stale-marking sweeps")
    parser.add_argument("--private-postgres", action="store_true", help="a throw-away PostgreSQL on a free port")
    parser.add_argument("--postgres", default=os.environ.get("BENCH_POSTGRES", "postgres://postgres@127.0.0.1:5432"))
    parser.add_argument("--out", default=str(RESULTS), help="directory for scaleout.json")
    parser.add_argument("--keep", action="store_true", help="keep the temporary directory (logs) afterwards")
    return parser.parse_args(argv)


@dataclass
class Beat:
    """One heartbeat as an agent sees it: when, the first try's status, and the retry's if there was one."""

    at: float
    first: int
    retried: int | None = None
    seconds: float = 0.0

    @property
    def lost(self) -> bool:
        return self.first != 200 and self.retried != 200


class RetryingFleet(Fleet):
    """The soak's fleet, retrying a failed heartbeat once as the agent does, and keeping each beat's outcome."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.beats: list[Beat] = []

    async def beat(self, node: SimNode) -> int:
        started, clock = time.time(), time.perf_counter()
        registered = node.token is not None
        status = await super().beat(node)
        if not registered:
            return status  # the warm-up's registrations are not what is measured
        record = Beat(started, status)
        if status != 200 and not self.stopping.is_set():
            await asyncio.sleep(node.rng.uniform(0, AGENT_FIRST_BACKOFF))
            record.retried = status = await super().beat(node)
        record.seconds = time.perf_counter() - clock
        self.beats.append(record)
        return status


def liveness_changes(database_url: str, since: float) -> int:
    with psycopg.connect(database_url) as conn:
        row = conn.execute(
            "SELECT count(*) FROM inventory_nodeevent WHERE kind = 'liveness' AND at >= to_timestamp(%s)", (since,)
        ).fetchone()
    assert row is not None  # a count has a row
    return row[0]


def nodes_alive(database_url: str) -> int:
    with psycopg.connect(database_url) as conn:
        row = conn.execute("SELECT count(*) FROM inventory_node WHERE liveness = 'alive'").fetchone()
    assert row is not None  # a count has a row
    return row[0]


def percentile(values: list[float], share: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(int(len(ordered) * share), len(ordered) - 1)]


class ScaleOut:
    def __init__(self, args: argparse.Namespace):
        self.args = args
        self.var = Path(tempfile.mkdtemp(prefix="llmgw-scaleout-"))
        self.timeline: list[dict] = []
        self.t0 = time.time()

    def mark(self, event: str, **details) -> None:
        entry = {"t": round(time.time() - self.t0, 1), "event": event, **details}
        self.timeline.append(entry)
        print(f"[{entry['t']:6.1f} s] {event} {json.dumps(details) if details else ''}", flush=True)

    def start(self) -> None:
        a = self.args
        if a.private_postgres:
            self.postgres: PrivatePostgres | SharedPostgres = PrivatePostgres("llmgw_bench_scaleout").start()
        else:
            self.postgres = SharedPostgres(f"{a.postgres}/llmgw_bench_scaleout", []).start()
        self.join_token = secrets.token_urlsafe(32)
        self.stack = Stack(
            self.var,
            {
                "DATABASE_URL": self.postgres.url,
                "REDIS_URL": f"redis://127.0.0.1:{free_port()}/0",
                "LLMGW_JOIN_TOKEN": self.join_token,
                "DEBUG": "false",
                "SECRET_KEY": secrets.token_urlsafe(50),
                "ALLOWED_HOSTS": "127.0.0.1,localhost",
                "SECURE_SSL_REDIRECT": "false",
                # Plain HTTP on loopback, as no TLS is in front: tokens may cross it (nodes/entry.py).
                "LLMGW_REQUIRE_HTTPS": "false",
                "LLMGW_HEARTBEAT_INTERVAL": str(a.interval),
                "LLMGW_UNREACHABLE_AFTER": str(a.unreachable_after),
                "LLMGW_LOST_AFTER": str(max(a.unreachable_after * 10, 300)),
                "LLMGW_BEAT_PERIOD": str(a.beat_period),
                # The whole simulated fleet registers from 127.0.0.1 within one interval.
                "LLMGW_REGISTER_PER_MINUTE": str(max(a.nodes * 4, 100)),
            },
            web_port=free_port(),
            workers=a.workers,
            web_instances=2,
        )
        self.stack.start(self.stack.redis_part())
        self.stack.manage("migrate", "--noinput", "-v0")
        self.stack.start_web()
        self.stack.start(self.stack.celery_part())
        self.mark("stack up", instances=[b.name for b in self.stack.backends], workers_each=a.workers)

    def served(self) -> dict[str, int]:
        """Requests each instance has been sent so far (HAProxy's `stot`)."""
        return {
            row["svname"]: int(row["stot"] or 0)
            for row in proxy.stats(self.stack.stats_socket)
            if row["pxname"] == "web" and row["svname"] not in ("FRONTEND", "BACKEND")
        }

    def proxy_cpu(self) -> float:
        times = psutil.Process(self.stack.parts["proxy"].pid).cpu_times()
        return times.user + times.system

    def state_of(self, server: str) -> str:
        return proxy.server_states(self.stack.stats_socket).get(server, "")

    async def run(self) -> dict:
        a = self.args
        await asyncio.to_thread(self.start)
        self.fleet = RetryingFleet("127.0.0.1", self.stack.web_port, self.join_token, a.nodes, interval=a.interval)
        beating = asyncio.create_task(self.fleet.run())
        # Measuring starts once every node has registered and beaten within the last two intervals.
        deadline = time.time() + max(180, a.nodes / 5)
        while not all(node.last_ok_at > time.time() - 2 * a.interval for node in self.fleet.nodes):
            if time.time() > deadline:
                raise RuntimeError("the fleet did not register and beat in time")
            await asyncio.sleep(0.5)
        start = time.time()
        proxy_cpu = self.proxy_cpu()
        self.mark("fleet beating; measuring", nodes=a.nodes)
        served_before = await asyncio.to_thread(self.served)

        await asyncio.sleep(a.seconds / 3)
        await asyncio.to_thread(self.stack.stop, KILLED, signal.SIGKILL)
        # Its listening socket goes with the last of its processes, a moment after the master is
        # reaped; from then on a request can only be refused a connection, never answered 502,
        # so a 502 for a request begun before then was one the instance held.
        port = self.stack.backends[1].port
        await asyncio.to_thread(wait_until, lambda: not port_open(port), 10, f"{KILLED}'s port to close")
        killed_at = time.time()
        self.mark(f"{KILLED} killed (SIGKILL)")
        await asyncio.to_thread(wait_until, lambda: self.state_of(KILLED).startswith("DOWN"), 30, f"{KILLED} DOWN")
        down_after = time.time() - killed_at
        self.mark(f"HAProxy marked {KILLED} down", seconds=round(down_after, 2))
        served_at_kill = await asyncio.to_thread(self.served)

        await asyncio.sleep(max(start + 2 * a.seconds / 3 - time.time(), 0))
        await asyncio.to_thread(self.stack.start, self.stack.web_part(1))
        restarted_at = time.time()
        await asyncio.to_thread(wait_until, lambda: self.state_of(KILLED) == "UP", 30, f"{KILLED} UP again")
        self.mark(f"{KILLED} started again and UP", seconds=round(time.time() - restarted_at, 2))

        await asyncio.sleep(max(start + a.seconds - time.time(), 0))
        end = time.time()
        self.proxy_cpu_seconds = self.proxy_cpu() - proxy_cpu
        served_after = await asyncio.to_thread(self.served)
        stats = await asyncio.to_thread(proxy.stats, self.stack.stats_socket)
        self.fleet.stop()
        await beating
        # Heartbeats flushed and swept after the window: a change they cause still counts.
        await asyncio.sleep(a.beat_period * 2)
        changes = await asyncio.to_thread(liveness_changes, self.postgres.url, start)
        alive = await asyncio.to_thread(nodes_alive, self.postgres.url)
        return self.report(
            start, end, killed_at, down_after, served_before, served_at_kill, served_after, stats, changes, alive
        )

    def report(self, start, end, killed_at, down_after, before, at_kill, after, stats, changes, alive) -> dict:
        a = self.args
        beats = [b for b in self.fleet.beats if start <= b.at < end]
        failed_first = [b for b in beats if b.first != 200]
        lost = [b for b in beats if b.lost]
        backend = next(r for r in stats if r["pxname"] == "web" and r["svname"] == "BACKEND")
        latencies = [b.seconds * 1000 for b in beats]
        figures = {
            "heartbeats": len(beats),
            "offered_per_second": round(a.nodes / a.interval, 1),
            "answered_per_second": round(sum(b.first == 200 or b.retried == 200 for b in beats) / (end - start), 1),
            "failed_first_try": len(failed_first),
            "first_try_statuses": dict(sorted(Counter(b.first for b in failed_first).items())),
            # When each began, from the moment the killed instance was dead (negative: before).
            "first_try_failures_began_s": [round(b.at - killed_at, 2) for b in failed_first],
            "answered_on_retry": sum(b.retried == 200 for b in failed_first),
            "lost_after_retry": len(lost),
            "p50_ms": round(statistics.median(latencies), 1) if latencies else 0.0,
            "p99_ms": round(percentile(latencies, 0.99), 1),
            "seconds_to_mark_down": round(down_after, 2),
            "proxy_cpu_us_per_heartbeat": round(self.proxy_cpu_seconds / max(len(beats), 1) * 1e6, 1),
            "haproxy_retries": int(backend.get("wretr") or 0),
            "haproxy_redispatches": int(backend.get("wredis") or 0),
            "served_by_instance": {name: after[name] - before.get(name, 0) for name in after},
            "served_by_killed_instance_before_kill": at_kill.get(KILLED, 0) - before.get(KILLED, 0),
            "liveness_changes": changes,
            "nodes_alive_at_end": alive,
        }
        checks = {
            "no heartbeat lost beyond the agent's retry": figures["lost_after_retry"] == 0,
            "no node changed liveness": changes == 0 and alive == a.nodes,
            # Only requests the killed instance held when it died (in a worker or its backlog: sent,
            # never answered, 502) may fail their first try; one sent there later and answered 503
            # would mean HAProxy did not resend it to the live instance.
            "first-try failures only requests in flight at the kill": all(
                b.first == 502 and b.at <= killed_at for b in failed_first
            ),
            "both instances served before the kill": all(
                at_kill.get(b.name, 0) > before.get(b.name, 0) for b in self.stack.backends
            ),
        }
        result = {
            "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "settings": {
                "nodes": a.nodes,
                "interval_s": a.interval,
                "window_s": a.seconds,
                "instances": 2,
                "workers_per_instance": a.workers,
                "unreachable_after_s": a.unreachable_after,
                "cpus": os.cpu_count(),
                "load_average_at_end": [round(x, 2) for x in os.getloadavg()],
            },
            "timeline": self.timeline,
            "figures": figures,
            "checks": checks,
            "ok": all(checks.values()),
        }
        print(json.dumps({"figures": figures, "checks": checks}, indent=1))
        return result

    def stop(self) -> None:
        if hasattr(self, "stack"):
            self.stack.stop_all()
        if hasattr(self, "postgres"):
            self.postgres.stop()
        if self.args.keep:
            print(f"logs kept in {self.var / 'log'}")
        else:
            shutil.rmtree(self.var, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    run = ScaleOut(args)
    try:
        result = asyncio.run(run.run())
    finally:
        run.stop()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "scaleout.json").write_text(json.dumps(result, indent=1) + "\n")
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
