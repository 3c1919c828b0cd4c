"""How late paced serving work runs beside bursts of batch work started in another session, by how the batch is niced.

    python -m bench.fleetlib.sessions [--seconds 8] [--burst 6] [--rounds 2]

Models the stack on one machine (devstack/stack.py starts each part in a session of
its own): one serving process per core, each due every 2 ms to do 1.3 ms of CPU (the
web tier's steady share of the 2-core machine), and, a second after they start, one
batch process per core burning CPU for `--burst` seconds (a /metrics render, a
Prometheus scrape). The batch runs at equal priority, under `nice -n 10`, under
`nice -n 10` with its session's weight set as the stack sets it
(devstack.priority.yield_cores), and that under the SCHED_IDLE policy too. Prints,
per way and round, how late the serving work started against its due time (p50, p99,
max over both serving processes).
docs/operations.md, "Heartbeats at 10,000 nodes", quotes it.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

from devstack.priority import autogroups_enabled, yield_cores
from devstack.stack import BACKGROUND_NICE

PERIOD = 0.002
WORK = 0.0013


def serve(seconds: float) -> None:
    """Be the serving process: print the lateness of each due start, in seconds, sorted, as JSON."""
    late: list[float] = []
    start = time.perf_counter()
    n = 0
    while n * PERIOD <= seconds:
        due = start + n * PERIOD
        now = time.perf_counter()
        if now < due:
            time.sleep(due - now)
        began = time.perf_counter()
        late.append(began - due)
        while time.perf_counter() < began + WORK:
            pass
        n += 1
    print(json.dumps(sorted(late)))


def burn(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


# How each way starts the batch; "session" is the stack's (devstack/stack.py). "idle" adds the SCHED_IDLE
# policy, which any other task's wake-up preempts at once: tried for the stack on 7 December, not kept
# (docs/operations.md, "The background under SCHED_IDLE").
PREFIXES = {
    "equal": [],
    "nice": ["nice", "-n", str(BACKGROUND_NICE)],
    "session": ["nice", "-n", str(BACKGROUND_NICE)],
    "idle": ["chrt", "--idle", "0", "nice", "-n", str(BACKGROUND_NICE)],
}


def child(*args: str, prefix: list[str] | None = None) -> subprocess.Popen:
    command = [*(prefix or []), sys.executable, "-m", "bench.fleetlib.sessions", *args]
    return subprocess.Popen(command, stdout=subprocess.PIPE, text=True, start_new_session=True)


def one_round(way: str, seconds: float, burst: float) -> dict[str, float]:
    cores = os.cpu_count() or 1
    servers = [child("--serve", str(seconds)) for _ in range(cores)]
    time.sleep(1)
    batch = [child("--burn", str(burst), prefix=PREFIXES[way]) for _ in range(cores)]
    if way in ("session", "idle"):
        for process in batch:
            yield_cores(process.pid, BACKGROUND_NICE)
    for process in batch:
        process.wait()
    late = sorted(x for s in servers for x in json.loads(s.communicate()[0]))
    return {
        "p50_ms": round(1000 * late[len(late) // 2], 2),
        "p99_ms": round(1000 * late[int(0.99 * (len(late) - 1))], 2),
        "max_ms": round(1000 * late[-1], 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=8.0, help="each serving process's run")
    parser.add_argument("--burst", type=float, default=6.0, help="each batch process's burn")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--serve", type=float, help=argparse.SUPPRESS)
    parser.add_argument("--burn", type=float, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve is not None:
        return serve(args.serve)
    if args.burn is not None:
        return burn(args.burn)
    print(f"{os.cpu_count()} cores, sessions grouped by the kernel: {autogroups_enabled()}")
    print(f"serving work due every {PERIOD * 1000:g} ms, {WORK * 1000:g} ms of CPU each; how late it started:")
    print("batch                          round  p50 ms  p99 ms  max ms")
    ways = {
        "equal": "at equal priority",
        "nice": f"nice -n {BACKGROUND_NICE}",
        "session": f"nice -n {BACKGROUND_NICE}, session's too",
        "idle": "the same, and SCHED_IDLE",
    }
    for round_ in range(1, args.rounds + 1):
        for way, label in ways.items():
            r = one_round(way, args.seconds, args.burst)
            print(f"{label:30} {round_:5d} {r['p50_ms']:7.2f} {r['p99_ms']:7.2f} {r['max_ms']:7.2f}")


if __name__ == "__main__":
    main()
