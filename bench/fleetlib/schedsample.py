"""What each part of the stack did with the cores, every 0.1 s: CPU time run, and time waiting for a core.

    python -m bench.fleetlib.schedsample --seconds 600 --out /tmp/sched.jsonl   # beside a benchmark
    python -m bench.fleetlib.schedsample --read /tmp/sched.jsonl                # per second, as a table

Each sample sums `/proc/PID/task/*/schedstat` (nanoseconds on a CPU, nanoseconds runnable but waiting)
over the processes of each part, told apart by their command lines, and writes the differences since
the last sample as cores busy and cores' worth of waiting. A single-threaded part (HAProxy) that
waits for a core holds every request behind it for that long (docs/operations.md, "Heartbeats at
10,000 nodes").
"""

from __future__ import annotations

import argparse
import json
import os
import time
from collections import defaultdict
from pathlib import Path

# Command-line words that tell the parts apart, first match wins; anything else is "other".
PARTS = (
    ("granian", "web"),
    ("celery", "celery"),
    ("haproxy", "haproxy"),
    ("redis-server", "redis"),
    ("prometheus", "prometheus"),
    ("postgres", "postgres"),
    ("bench", "generator"),
)
PERIOD = 0.1


def part_of(command: str) -> str:
    return next((part for word, part in PARTS if word in command), "other")


def totals() -> dict[str, tuple[int, int]]:
    """Nanoseconds run and waited so far, by part, over every live thread."""
    found: dict[str, tuple[int, int]] = defaultdict(lambda: (0, 0))
    own = str(os.getpid())
    for pid in filter(str.isdigit, os.listdir("/proc")):
        if pid == own:
            continue
        try:
            command = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            tasks = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue
        part = part_of(command)
        for task in tasks:
            try:
                ran, waited = Path(f"/proc/{pid}/task/{task}/schedstat").read_text().split()[:2]
            except (OSError, ValueError):
                continue
            before = found[part]
            found[part] = (before[0] + int(ran), before[1] + int(waited))
    return found


def sample(seconds: float, out: Path) -> None:
    previous = totals()
    end = time.monotonic() + seconds
    with out.open("w") as sink:
        while time.monotonic() < end:
            time.sleep(PERIOD)
            now = totals()
            row: dict[str, object] = {"t": round(time.time(), 2)}
            for part, (ran, waited) in now.items():
                ran_before, waited_before = previous.get(part, (ran, waited))
                # A process gone since the last sample takes its time with it: never below nothing.
                row[part] = [
                    max(0.0, (ran - ran_before) / 1e9 / PERIOD),
                    max(0.0, (waited - waited_before) / 1e9 / PERIOD),
                ]
            sink.write(json.dumps(row) + "\n")
            sink.flush()
            previous = now


def read(path: Path) -> None:
    """Per second: each part's cores busy / cores' worth of waiting for a core."""
    seconds: dict[int, dict[str, list[float]]] = defaultdict(lambda: defaultdict(lambda: [0.0, 0.0]))
    for line in path.read_text().splitlines():
        row = json.loads(line)
        second = int(row.pop("t"))
        for part, (busy, waiting) in row.items():
            seconds[second][part][0] += busy * PERIOD
            seconds[second][part][1] += waiting * PERIOD
    parts = [part for _, part in PARTS] + ["other"]
    print("second    " + " ".join(f"{part:>14}" for part in parts))
    for second in sorted(seconds):
        cells = " ".join(f"{seconds[second][p][0]:.2f}/{seconds[second][p][1]:.2f}".rjust(14) for p in parts)
        print(time.strftime("%H:%M:%S", time.gmtime(second)), cells)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.fleetlib.schedsample", description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=600, help="how long to sample")
    parser.add_argument("--out", type=Path, help="where the samples go (JSON lines)")
    parser.add_argument("--read", type=Path, help="print a file of samples per second instead")
    args = parser.parse_args(argv)
    if args.read:
        read(args.read)
    elif args.out:
        sample(args.seconds, args.out)
    else:
        parser.error("--out FILE to sample, or --read FILE to print")


if __name__ == "__main__":
    main()
