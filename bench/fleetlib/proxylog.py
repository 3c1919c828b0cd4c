"""HAProxy's timers for the heartbeats of a stack's proxy log, second by second, the slow seconds marked.

    python -m bench.fleetlib.proxylog var/log/proxy.log

Only a log of every request says where a slow second's beats waited: `TR` (the request received),
`Tw` (queued for a web worker), `Tr` (the worker's answer), `Ta` (all), and how long HAProxy accepted
nothing. deploy/haproxy.cfg logs errors only (`option dontlog-normal`); take that line out for the
run to read (docs/operations.md, "Heartbeats at 10,000 nodes").
"""

from __future__ import annotations

import argparse
import re
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

LINE = re.compile(
    r"\[(\d+/\w+/\d+:\d+:\d+:\d+\.\d+)\] \S+ \S+ (-?\d+)/(-?\d+)/(-?\d+)/(-?\d+)/(-?\d+) \d+ .*\"POST /api/v1/heartbeat"
)
# A second is slow when its p99 or its longest time without an accept passes this.
SLOW_MS = 100


@dataclass
class Second:
    totals: list[int] = field(default_factory=list)
    queued: int = 0
    answered: int = 0
    received: int = 0
    gap: float = 0.0


def read(path: Path) -> dict[int, Second]:
    seconds: dict[int, Second] = {}
    previous = None
    for line in path.open(errors="replace"):
        if not (match := LINE.search(line)):
            continue
        at = datetime.strptime(match.group(1), "%d/%b/%Y:%H:%M:%S.%f").timestamp()
        received, queued, _, answered, total = (int(match.group(i)) for i in range(2, 7))
        second = seconds.setdefault(int(at), Second())
        second.totals.append(total)
        second.queued, second.answered = max(second.queued, queued), max(second.answered, answered)
        second.received = max(second.received, received)
        if previous is not None:
            second.gap = max(second.gap, at - previous)
        previous = at
    return seconds


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.fleetlib.proxylog", description=__doc__.splitlines()[0])
    parser.add_argument("log", type=Path)
    args = parser.parse_args(argv)
    print("second    beats  Ta p99  most Tw  most Tr  most TR  no accept (ms)")
    for at, second in sorted(read(args.log).items()):
        totals = sorted(second.totals)
        p99 = totals[int(len(totals) * 0.99)]
        gap = 1000 * second.gap
        mark = "  <<<" if p99 > SLOW_MS or gap > SLOW_MS else ""
        print(
            f"{datetime.fromtimestamp(at).strftime('%H:%M:%S')}  {len(totals):5d}  {p99:6d}  {second.queued:7d}  "
            f"{second.answered:7d}  {second.received:7d}  {gap:14.0f}{mark}"
        )


if __name__ == "__main__":
    main()
