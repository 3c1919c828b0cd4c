"""Fresh loopback connections at a fleet's pace, and how long each `connect()` takes, second by second.

    python -m bench.fleetlib.connect_probe [--seconds 80] [--rate 2000]

At 10,000 nodes bench.heartbeat's fleet connects afresh for every beat (this machine's file
descriptor limit), some 2,000 connections a second with thousands in TIME_WAIT. This does only that,
against a listener that accepts and closes, so a stall in the kernel's choice of a local port would
show here without the stack (docs/operations.md, "Heartbeats at 10,000 nodes").
"""

from __future__ import annotations

import argparse
import socket
import threading
import time


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.fleetlib.connect_probe", description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=int, default=80)
    parser.add_argument("--rate", type=int, default=2000, help="connections a second")
    args = parser.parse_args(argv)
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(4096)
    port = listener.getsockname()[1]

    def accept() -> None:
        while True:
            connection, _ = listener.accept()
            connection.close()

    threading.Thread(target=accept, daemon=True).start()
    took: dict[int, list[float]] = {}
    started = time.monotonic()
    for n in range(args.seconds * args.rate):
        due = started + n / args.rate
        if (wait := due - time.monotonic()) > 0:
            time.sleep(wait)
        client = socket.socket()
        before = time.perf_counter()
        client.connect(("127.0.0.1", port))
        took.setdefault(n // args.rate, []).append(1000 * (time.perf_counter() - before))
        client.close()
    print("second  connections  p50 ms  p99 ms  max ms")
    for second, values in sorted(took.items()):
        values.sort()
        p50, p99 = values[len(values) // 2], values[int(len(values) * 0.99)]
        print(f"{second:6d}  {len(values):11d}  {p50:6.3f}  {p99:6.3f}  {values[-1]:6.1f}")


if __name__ == "__main__":
    main()
