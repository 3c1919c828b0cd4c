"""How long one big read holds Redis from everyone else: one MGET of a fleet's /metrics lines against batches.

    python -m bench.fleetlib.redis_reads [--nodes 10000] [--bytes 2500] [--batch 500] [--rounds 5]

Writes `--nodes` keys of `--bytes` each under a prefix of its own in Redis at REDIS_URL
(default redis://127.0.0.1:6379/0), reads them all `--rounds` times in one MGET and then in
MGETs of `--batch` (as livestate.loadstore does), while a second client sends PING every
half millisecond; prints each way's time per read of all and the PINGs' p99 and max.
Deletes its keys at the end. docs/operations.md, "Big reads held Redis", quotes it.
"""

from __future__ import annotations

import argparse
import os
import secrets
import threading
import time

import redis


def pings(url: str, out: list[float], stop: threading.Event) -> None:
    client = redis.Redis.from_url(url)
    while not stop.is_set():
        started = time.perf_counter()
        client.ping()
        out.append(time.perf_counter() - started)
        time.sleep(0.0005)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=10_000)
    parser.add_argument("--bytes", type=int, default=2_500, help="a node's /metrics lines, about 2.5 KB with 8 GPUs")
    parser.add_argument("--batch", type=int, default=500)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    url = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0")
    client = redis.Redis.from_url(url)
    prefix = f"llmgw-bench-redis-reads:{secrets.token_hex(4)}:"
    names = [f"{prefix}{i}" for i in range(args.nodes)]
    try:
        pipe = client.pipeline(transaction=False)
        for name in names:
            pipe.set(name, b"x" * args.bytes, ex=600)
        pipe.execute()
        for label, size in ((f"one MGET of {args.nodes}", args.nodes), (f"MGETs of {args.batch}", args.batch)):
            waits: list[float] = []
            stop = threading.Event()
            pinger = threading.Thread(target=pings, args=(url, waits, stop))
            pinger.start()
            time.sleep(0.2)
            started = time.perf_counter()
            for _ in range(args.rounds):
                for start in range(0, len(names), size):
                    client.mget(names[start : start + size])
            took = (time.perf_counter() - started) / args.rounds
            stop.set()
            pinger.join()
            waits.sort()
            print(
                f"{label}: {took * 1000:.1f} ms a read of all; a PING beside it: "
                f"p99 {waits[int(len(waits) * 0.99)] * 1000:.2f} ms, max {waits[-1] * 1000:.1f} ms"
            )
    finally:
        for start in range(0, len(names), 1000):
            client.delete(*names[start : start + 1000])


if __name__ == "__main__":
    main()
