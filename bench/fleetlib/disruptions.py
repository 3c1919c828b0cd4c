"""The fleet's moments of recovery, second by second: `python -m bench.recovery --cases …`.

One stack as `make run` starts it (HAProxy, granian with cores + 1 workers,
Celery worker and beat, a redis-server of its own; DEBUG off) on a PostgreSQL
cluster of its own (bench/soaklib/postgres.py, PrivatePostgres: initdb on a
free port), since some cases restart it and flush or restart Redis, which must
never be the machine's. The fleet registers through the API (the soak's
machine classes, bench/fleetlib/bodies.py) and beats open loop at its interval
(bench/fleetlib/pacer.py): a beat the control plane does not answer in time is
not waited for. Then each case, in turn on the same stack and fleet:

- `registered`: the fleet's first beats after its registration (cold cards,
  issue 25's second case);
- `partition`: the fleet silent for `--silence` seconds (210: 3.5 minutes)
  while the control plane stays up, then back at its pace;
- `flushed`: Redis loses its data under load (FLUSHALL);
- `redis-restart`: Redis restarted with its data (its snapshot saved on
  shutdown and read on start);
- `redis-restart-empty`: Redis restarted without it (snapshot removed);
- `postgres-restart`: PostgreSQL restarted under load (`pg_ctl restart -m fast`).

Each disruption comes `LEAD` seconds into a phase of the fleet beating and
is watched for `--watch` seconds after it (the partition: from the fleet's
return; registration: from the first beat). Second by second, by the beats'
due times: beats due, answered (2xx), their p99 from the due time, beats not
sent in time (more than 0.5 s late, or not sent at all because 2,000 were
already waiting in a generator), failures (no answer or not 2xx), and nodes
marked unreachable (a flap: every node was beating). The fleet is *back* after
the last degraded second: one with answered below 99 % of due, p99 over
`P99_TARGET_MS`, a beat not sent in time, a failure or a flap. Target (issue
25): back within one interval, p99 under 250 ms, no beat lost, no flap. The
first `TENTHS_SECONDS` are also told a tenth of a second at a time (answered,
p50, p99 and worst latency), which shows whether a second's slow beats were a
queue that built and drained or a stall.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

from bench.fleetlib.pacer import HEARTBEAT, PacedFleet, Phase, PhaseStats, fleet_tails
from bench.soaklib.postgres import PrivatePostgres
from devstack import proxy
from devstack.polling import wait_until
from devstack.ports import free_port
from devstack.stack import Stack, default_workers, redis_answers

CASES = ("registered", "partition", "flushed", "redis-restart", "redis-restart-empty", "postgres-restart")
JOIN_TOKEN = "bench-join-token"
DATABASE = "llmgw_bench_recovery"
# Seconds of steady beating before each disruption, and after each case before the next.
LEAD = 10.0
SETTLE = 20.0
SETTLE_MAX = 120.0
# The first seconds after a disruption are also told a tenth of a second at a time.
TENTHS_SECONDS = 2
P99_TARGET_MS = 250.0
ANSWERED_SHARE = 0.99

# The times (Unix s) of liveness events to `unreachable` in a window, read through Django.
FLAPS_SCRIPT = """
import datetime, json
from inventory.models import Liveness, NodeEvent
since = datetime.datetime.fromtimestamp({since}, datetime.UTC)
until = datetime.datetime.fromtimestamp({until}, datetime.UTC)
found = NodeEvent.objects.filter(
    kind=NodeEvent.Kind.LIVENESS, to_state=Liveness.UNREACHABLE, at__gte=since, at__lt=until
).values_list("at", flat=True)
print("FLAPS", json.dumps([at.timestamp() for at in found]))
"""


def percentile_ms(ordered: list[float], q: float) -> float | None:
    """The `q` quantile of latencies sorted in seconds, in ms; None for none. The one rule for every figure here."""
    return round(1000 * ordered[int(q * (len(ordered) - 1))], 1) if ordered else None


def per_second(stats: PhaseStats, start: float, seconds: int, flaps: list[float]) -> list[dict]:
    """The phase second by second from `start` (time.monotonic()), by due time; `flaps` in seconds since start."""

    def second(due: float) -> int | None:
        s = int(due - start) if due >= start else -1
        return s if 0 <= s < seconds else None

    def count(times) -> Counter:
        return Counter(s for s in map(second, times) if s is not None)

    due, not_in_time, unsent = (
        count(stats.offered_due),
        count([*stats.late_due, *stats.unsent_due]),
        count(stats.unsent_due),
    )
    flapped = count(start + at for at in flaps)
    latencies: dict[int, list[float]] = {}
    for at, latency in zip(stats.due_times, stats.latencies, strict=True):
        if (s := second(at)) is not None:
            latencies.setdefault(s, []).append(latency)
    rows = []
    for s in range(seconds):
        answered = sorted(latencies.get(s, []))
        rows.append(
            {
                "second": s,
                "due": due[s],
                "answered": len(answered),
                "p99_ms": percentile_ms(answered, 0.99),
                "not_in_time": not_in_time[s],
                # Neither answered nor left unsent: refused, failed, or not answered before the generator's timeout.
                "failed": due[s] - len(answered) - unsent[s],
                "flaps": flapped[s],
            }
        )
    return rows


def per_tenth(stats: PhaseStats, start: float, seconds: int = TENTHS_SECONDS) -> list[dict]:
    """The first `seconds` from `start` a tenth of a second at a time, by due time: the beats answered, their p50,
    p99 and worst latency. A second's p99 is its slowest beats; these tell whether they were a queue that
    built and drained (each tenth's latency falling as it drains) or a stall of the whole second."""
    latencies: dict[int, list[float]] = {}
    for at, latency in zip(stats.due_times, stats.latencies, strict=True):
        if start <= at < start + seconds:
            latencies.setdefault(int(10 * (at - start)), []).append(latency)
    rows = []
    for tenth in range(10 * seconds):
        answered = sorted(latencies.get(tenth, []))
        rows.append(
            {
                "from_s": tenth / 10,
                "answered": len(answered),
                "p50_ms": percentile_ms(answered, 0.5),
                "p99_ms": percentile_ms(answered, 0.99),
                "max_ms": percentile_ms(answered, 1.0),
            }
        )
    return rows


def degraded(row: dict) -> bool:
    return (
        row["answered"] < ANSWERED_SHARE * row["due"]
        or (row["p99_ms"] is not None and row["p99_ms"] > P99_TARGET_MS)
        or row["not_in_time"] > 0
        or row["failed"] > 0
        or row["flaps"] > 0
    )


def summarize(name: str, rows: list[dict], interval: float, note: str, marked_before: int = 0) -> dict:
    """The case in one line's figures: when the fleet was back, and how it fared until then and over the watch.

    `marked_before`: nodes marked unreachable in the case before the watched seconds (the partition's
    silence, when the fleet really was silent; the lead before a disruption).
    """
    bad = [r["second"] for r in rows if degraded(r)]
    back_after = bad[-1] + 1 if bad else 0
    window = rows[:back_after]
    p99s = [r["p99_ms"] for r in rows if r["p99_ms"] is not None]
    due = sum(r["due"] for r in rows)
    return {
        "case": name,
        "note": note,
        "back_after_s": back_after,
        "back_within_one_interval": back_after <= interval,
        "degraded_seconds": len(bad),
        "due": due,
        "answered": sum(r["answered"] for r in rows),
        # Until the fleet was back; None if it never left.
        "answered_per_second_while_degraded": (
            round(sum(r["answered"] for r in window) / len(window), 1) if window else None
        ),
        "due_per_second_while_degraded": round(sum(r["due"] for r in window) / len(window), 1) if window else None,
        "due_per_second": round(due / max(len(rows), 1), 1),
        "worst_second_p99_ms": max(p99s, default=None),
        "not_in_time": sum(r["not_in_time"] for r in rows),
        "failed": sum(r["failed"] for r in rows),
        "flaps": sum(r["flaps"] for r in rows),
        "marked_unreachable_before": marked_before,
    }


def summary_line(s: dict) -> str:
    return (
        f"{s['case']}: back after {s['back_after_s']} s ({s['degraded_seconds']} degraded seconds); "
        f"answered {s['answered']} of {s['due']} due; {s['answered_per_second_while_degraded']}/s answered "
        f"while degraded of {s['due_per_second_while_degraded']}/s due; "
        f"worst second's p99 {s['worst_second_p99_ms']} ms; "
        f"not sent in time {s['not_in_time']}; failed {s['failed']}; flaps {s['flaps']} "
        f"(marked unreachable before: {s['marked_unreachable_before']}); "
        f"p99 before the disruption {s.get('p99_before_ms')} ms"
    )


class Recovery:
    """The stack, its own PostgreSQL and the paced fleet; each case run on them in turn."""

    def __init__(self, args):
        self.args = args
        self.var = Path(tempfile.mkdtemp(prefix="llmgw-bench-recovery-"))
        self.postgres = PrivatePostgres(DATABASE)
        self.stack: Stack | None = None
        self.fleet: PacedFleet | None = None
        self.results: list[dict] = []
        # Whether the fleet was steady again after each case (before the next began).
        self.settled: list[bool] = []

    # -- the stack ---------------------------------------------------------------------------------

    def start(self) -> None:
        a = self.args
        self.postgres.start()
        self.redis_port = free_port()
        self.stack = Stack(
            self.var,
            env={
                "DATABASE_URL": self.postgres.url,
                "REDIS_URL": f"redis://127.0.0.1:{self.redis_port}/0",
                "LLMGW_JOIN_TOKEN": JOIN_TOKEN,
                "LLMGW_HEARTBEAT_INTERVAL": str(a.interval),
                # As production runs it (docs/operations.md): DEBUG off, no TLS on loopback.
                "DEBUG": "false",
                "SECRET_KEY": secrets.token_urlsafe(50),
                "ALLOWED_HOSTS": "127.0.0.1,localhost",
                "SECURE_SSL_REDIRECT": "false",
                "LLMGW_REQUIRE_HTTPS": "false",
                # The whole simulated fleet registers and beats from 127.0.0.1.
                "LLMGW_REGISTER_PER_MINUTE": str(max(a.nodes * 2, 100)),
                "LLMGW_AUTH_FAILURES_PER_MINUTE": "1000000",
            },
            web_port=free_port(),
            workers=a.workers or default_workers(),
        )
        self.stack.start(self.stack.redis_part())
        self.stack.prepare()
        self.stack.start_web()

    def stop(self) -> None:
        if self.fleet is not None:
            self.fleet.close()
        if self.stack is not None:
            self.stack.stop_all()
        self.postgres.stop()
        shutil.rmtree(self.var, ignore_errors=True)

    def redis(self):
        import redis

        return redis.Redis(port=self.redis_port, socket_timeout=10)

    def flaps(self, since: float, until: float) -> list[float]:
        assert self.stack is not None
        out = self.stack.manage("shell", "-c", FLAPS_SCRIPT.format(since=since, until=until), capture=True).stdout
        line = next(line for line in out.splitlines() if line.startswith("FLAPS "))
        return json.loads(line.split(" ", 1)[1])

    # -- the disruptions ---------------------------------------------------------------------------

    def flush_redis(self) -> None:
        self.redis().flushall()

    def restart_redis(self, keep_data: bool) -> None:
        """As an operator's restart does (SIGTERM, then a start): the stack's Redis has save points, so it
        writes its snapshot on the way down and reads it on the way up; `keep_data` False removes it between.

        No SAVE first: until 7 December one was sent, a second snapshot on the main thread that held every
        client for as long again (docs/operations.md, "Redis restarted with its data, as an operator does")."""
        assert self.stack is not None
        keys_before = self.redis().dbsize()
        self.stack.stop("redis")
        if not keep_data:
            for snapshot in (self.var / "redis").glob("*.rdb"):
                snapshot.unlink()
        self.stack.start(self.stack.redis_part())
        url = f"redis://127.0.0.1:{self.redis_port}/0"
        wait_until(lambda: redis_answers(url), 60, "Redis after its restart")
        if keep_data:
            # Read back from the snapshot, or the case would be the empty one under another name. The keys
            # written since the stop (heartbeats answered while it was down, keepers) are few beside these.
            kept = self.redis().dbsize()
            assert kept >= 0.9 * keys_before, f"Redis came back with {kept} keys of {keys_before}: no snapshot read"

    def restart_postgres(self) -> None:
        self.postgres.restart()

    # -- the cases ---------------------------------------------------------------------------------

    def record(self, name: str, stats: PhaseStats, start: float, flaps: list[float], note: str) -> None:
        """Print and keep one case: its seconds from `start` (monotonic), `flaps` in seconds since `start`."""
        rows = per_second(stats, start, int(self.args.watch), flaps)
        summary = summarize(name, rows, self.args.interval, note, sum(1 for f in flaps if f < 0))
        # The same phase's beats due before the disruption, for what this machine's noise looked like then.
        before = sorted(latency for due, latency in zip(stats.due_times, stats.latencies, strict=True) if due < start)
        summary["p99_before_ms"] = percentile_ms(before, 0.99)
        shown = max(summary["back_after_s"] + 5, 10)
        print(f"\n## {name}: {note}", file=sys.stderr)
        print("second  due  answered  p99_ms  not_in_time  failed  flaps", file=sys.stderr)
        for r in rows[:shown]:
            print(
                f"{r['second']:6d} {r['due']:5d} {r['answered']:9d} {r['p99_ms']!s:>7} "
                f"{r['not_in_time']:12d} {r['failed']:7d} {r['flaps']:6d}",
                file=sys.stderr,
            )
        tenths = per_tenth(stats, start)
        print("from_s  answered  p50_ms  p99_ms  max_ms", file=sys.stderr)
        for t in tenths:
            print(
                f"{t['from_s']:6.1f} {t['answered']:9d} {t['p50_ms']!s:>7} {t['p99_ms']!s:>7} {t['max_ms']!s:>7}",
                file=sys.stderr,
            )
        summary["load_average"] = round(os.getloadavg()[0], 1)
        print(summary_line(summary) + f"; load average {summary['load_average']}", file=sys.stderr)
        self.results.append({"summary": summary, "seconds": rows[:shown], "tenths": tenths})

    def disruption(self, name: str, act: Callable[[], None], note: str) -> None:
        a, fleet = self.args, self.fleet
        assert fleet is not None
        phase_seconds = LEAD + a.watch + 5
        began_wall = time.time()
        fleet.start(Phase(name, HEARTBEAT, a.interval, phase_seconds))
        time.sleep(LEAD)
        at = time.monotonic()
        at_wall = time.time()
        act()
        took = time.monotonic() - at
        time.sleep(max(phase_seconds - LEAD - took, 0))
        stats = fleet.collect(name)
        flaps = [t - at_wall for t in self.flaps(began_wall, time.time())]
        self.record(name, stats, at, flaps, f"{note} (took {took:.1f} s)")
        self.settle()

    def settle(self) -> None:
        """Beat on until a whole phase of SETTLE seconds is healthy (at most SETTLE_MAX): each case starts steady.

        A case the fleet did not come back from would otherwise be measured in the next one.
        """
        assert self.fleet is not None
        deadline = time.monotonic() + SETTLE_MAX
        healthy = False
        while not healthy and time.monotonic() < deadline:
            start = time.monotonic()
            self.fleet.start(Phase("settle", HEARTBEAT, self.args.interval, SETTLE))
            time.sleep(SETTLE)
            stats = self.fleet.collect("settle")
            rows = per_second(stats, start, int(SETTLE) - 1, [])
            healthy = not any(degraded(r) for r in rows)
        self.settled.append(healthy)
        if not healthy:
            print(f"not steady again within {SETTLE_MAX:g} s: the next case starts degraded", file=sys.stderr)

    def registered(self, nodes: list[tuple[str, bytes]]) -> None:
        """The fleet's first beats after registering; the sweeper starts after one interval, as in bench.heartbeat."""
        a = self.args
        assert self.stack is not None and self.fleet is not None
        at, at_wall = time.monotonic(), time.time()
        self.fleet.start(Phase("registered", HEARTBEAT, a.interval, a.watch + 5))
        time.sleep(a.interval)
        self.stack.start(self.stack.celery_part())
        time.sleep(max(at + a.watch + 5 - time.monotonic(), 0))
        stats = self.fleet.collect("registered")
        flaps = [t - at_wall for t in self.flaps(at_wall, time.time())]
        self.record("registered", stats, at, flaps, f"{len(nodes)} nodes' first beats after registering")
        self.settle()

    def partition(self) -> None:
        a, fleet = self.args, self.fleet
        assert fleet is not None
        # Longer than the silence: the next phase ends it when the fleet comes back.
        fleet.start(Phase("partition", HEARTBEAT, a.interval, a.silence + 30, silent=True))
        time.sleep(a.silence)
        back, back_wall = time.monotonic(), time.time()
        fleet.start(Phase("back", HEARTBEAT, a.interval, a.watch + 5))
        fleet.collect("partition")
        time.sleep(max(back + a.watch + 5 - time.monotonic(), 0))
        stats = fleet.collect("back")
        flaps = [t - back_wall for t in self.flaps(back_wall - a.silence, time.time())]
        note = f"the fleet silent for {a.silence:g} s, the control plane up; from its return"
        self.record("partition", stats, back, flaps, note)
        self.settle()

    def run(self) -> list[dict]:
        a = self.args
        self.start()
        assert self.stack is not None
        from bench.heartbeat import register_fleet

        started = time.monotonic()
        nodes = register_fleet(f"http://127.0.0.1:{self.stack.web_port}", a.nodes)
        registration_s = time.monotonic() - started
        print(f"registered {len(nodes)} nodes in {registration_s:.0f} s", file=sys.stderr)
        tails = fleet_tails("127.0.0.1", self.stack.web_port, nodes, proxy.max_connections())
        self.fleet = PacedFleet("127.0.0.1", self.stack.web_port, tails, a.interval, workers=a.generators)
        if "registered" in a.cases:
            self.registered(nodes)
        else:
            self.fleet.start(Phase("first beats", HEARTBEAT, a.interval, a.interval))
            self.fleet.collect("first beats")
            self.stack.start(self.stack.celery_part())
            self.settle()
            self.settled.clear()  # no case before it
        acts: dict[str, tuple[Callable[[], None], str]] = {
            "flushed": (self.flush_redis, "Redis lost its data (FLUSHALL)"),
            "redis-restart": (lambda: self.restart_redis(True), "Redis restarted with its data"),
            "redis-restart-empty": (lambda: self.restart_redis(False), "Redis restarted without its data"),
            "postgres-restart": (self.restart_postgres, "PostgreSQL restarted (pg_ctl restart -m fast)"),
        }
        for case in a.cases:
            if case == "partition":
                self.partition()
            elif case in acts:
                act, note = acts[case]
                self.disruption(case, act, note)
        for result, settled in zip(self.results, self.settled, strict=False):
            result["summary"]["registration_s"] = round(registration_s, 1)
            result["summary"]["steady_after"] = settled
        return self.results
