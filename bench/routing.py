"""Routing policies on a simulated fleet: time to first token and throughput at 80 % of capacity.

    python -m bench.routing [--seconds 25] [--load 0.8] [--runs 1] [--quick]

A fleet of stand-in engines (bench/standin/engine.py: 8 replicas of 4 slots, 2 of them
at half speed, each with a prefix cache) sits behind HAProxy configured one way per
round, each round on a fresh fleet (cold caches, empty queues):

- `roundrobin`: `balance roundrobin`;
- `leastconn` (least load): `balance leastconn`, least outstanding requests as HAProxy
  counts them, each replica weighted by what it reports, its slots (`/props`) times its
  decoding speed (`llamacpp:predicted_tokens_seconds`), read from the engines once a
  second and set over the Runtime API, as the control plane would;
- `leastconn-queue`: leastconn with each replica's `maxconn` at its slots, so the
  queue is HAProxy's one queue and a request goes to the first replica with a free slot;
- `affinity`: `balance hash` on the start of the body (model and first message) with
  `hash-type consistent` and `hash-balance-factor 125` (bounded load), weighted as leastconn.

The client sends streaming chat requests at Poisson arrivals (open loop) at `--load`
times the fleet's capacity: 70 % share one of 48 long prefixes (a system prompt or a
document, 300-1,500 tokens, some far more asked than others) followed by a short
question, 30 % are unique prompts of 20-400 tokens; answers are 4-256 tokens (mean
about 40). Capacity is what the fleet completes per second if no prompt is cached:
slots times speed, over the mean of prefill plus decode time of the workload. The
first `--warmup` seconds of arrivals are sent but not counted. Target: leastconn's
p99 time to first token at most half of roundrobin's.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import random
import statistics
import sys
import time
from dataclasses import dataclass

from bench.agent_cost import write_results
from bench.standin import client
from bench.standin.engine import Pace
from bench.standin.fleet import Fleet
from bench.standin.proxy import ROUTING_POLICIES, HAProxy, routing_config

MODEL = "standin"
PREFIXES = 48
SHARED = 0.7
# Weights are HAProxy's 1-256; a change under a tenth is left alone, so a consistent hash is not reshuffled by noise.
MAX_WEIGHT = 256
WEIGHED = ("leastconn", "affinity")


@dataclass(frozen=True)
class Request:
    body: bytes
    prompt_tokens: int
    max_tokens: int


def words(rng: random.Random, count: int, tag: str) -> str:
    return " ".join(f"{tag}{rng.randrange(20_000)}" for _ in range(count))


def workload(count: int, seed: int = 7) -> list[Request]:
    """`count` requests, the same for every policy: shared prefixes with short questions, and unique prompts."""
    rng = random.Random(seed)
    prefixes = [words(rng, rng.randint(300, 1500), f"p{k}x") for k in range(PREFIXES)]
    popularity = [1 / (k + 1) ** 0.8 for k in range(PREFIXES)]
    requests = []
    for _ in range(count):
        if rng.random() < SHARED:
            (prefix,) = rng.choices(prefixes, popularity)
            question = words(rng, rng.randint(10, 60), "q")
            messages = [{"role": "system", "content": prefix}, {"role": "user", "content": question}]
        else:
            messages = [{"role": "user", "content": words(rng, rng.randint(20, 400), "u")}]
        max_tokens = max(4, min(256, round(rng.lognormvariate(math.log(40) - 0.32, 0.8))))
        prompt_tokens = sum(len(m["content"].split()) for m in messages)
        requests.append(Request(client.chat_body(MODEL, messages, max_tokens), prompt_tokens, max_tokens))
    return requests


def capacity(requests: list[Request], pace: Pace, speeds: list[float]) -> float:
    """Requests per second the fleet completes with every slot busy and nothing cached."""
    service = statistics.fmean(r.prompt_tokens / pace.prefill_tps + r.max_tokens / pace.decode_tps for r in requests)
    return pace.slots * sum(speeds) / service


def metric(text: bytes, name: str) -> float:
    for line in text.decode().splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    return 0.0


async def weigh(haproxy: HAProxy, fleet: Fleet, stop: asyncio.Event) -> None:
    """Once a second, each replica's weight from what it reports: slots times decoding speed."""
    slots = {}
    for server in fleet.servers():
        slots[server.name] = json.loads(await client.get(server.port, "/props"))["total_slots"]
    speed: dict[str, float] = {}
    weight = {server.name: 100 for server in fleet.servers()}
    while not stop.is_set():
        for server in fleet.servers():
            seen = metric(await client.get(server.port, "/metrics"), "llamacpp:predicted_tokens_seconds")
            if seen > 0:
                speed[server.name] = seen if server.name not in speed else (speed[server.name] + seen) / 2
        if speed:
            known = {name: slots[name] * s for name, s in speed.items()}
            top = max(known.values())
            for name, each in known.items():
                wanted = max(1, round(MAX_WEIGHT * each / top))
                if abs(wanted - weight[name]) > weight[name] / 10:
                    haproxy.ask(f"set server replicas/{name} weight {wanted}")
                    weight[name] = wanted
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), 1.0)


async def one_policy(policy: str, args, requests: list[Request], rate: float) -> dict:
    with (
        Fleet(args.speeds, args.pace) as fleet,
        HAProxy(lambda port, sock: routing_config(policy, fleet.servers(), port, sock)) as haproxy,
    ):
        stop = asyncio.Event()
        weigher = asyncio.create_task(weigh(haproxy, fleet, stop)) if policy in WEIGHED else None
        pool = client.Pool(haproxy.port)
        started = time.perf_counter()
        outcomes = await client.open_loop(
            pool,
            lambda n: client.request_bytes("/v1/chat/completions", requests[n % len(requests)].body),
            rate,
            args.warmup + args.seconds,
            seed=args.seed,
        )
        finished = time.perf_counter()
        stop.set()
        if weigher:
            await weigher
        weights = haproxy.ask("show servers state replicas") if weigher else ""
        pool.close()
    counted = [(n, o) for n, o in enumerate(outcomes) if o.scheduled - started >= args.warmup]
    good = [o for _, o in counted if o.ok]
    prompt = sum(requests[n % len(requests)].prompt_tokens for n, o in counted if o.ok)
    ttft = [o.ttft * 1000 for o in good]
    return {
        "policy": policy,
        "requests": len(counted),
        "errors": len(counted) - len(good),
        "ttft_p50": client.quantile(ttft, 0.5),
        "ttft_p99": client.quantile(ttft, 0.99),
        "ttft_mean": statistics.fmean(ttft) if ttft else math.nan,
        # Over the whole round, warm-up included: every answer, until the last one ends.
        "requests_per_second": sum(o.ok for o in outcomes) / (finished - started),
        "tokens_per_second": sum(o.completion_tokens for o in outcomes if o.ok) / (finished - started),
        "cached_share": sum(o.cached_tokens for o in good) / prompt if prompt else 0.0,
        "late_ms_p99": client.quantile([(o.sent - o.scheduled) * 1000 for _, o in counted], 0.99),
        "weights": weight_column(weights),
        "failures": sorted({o.error or f"HTTP {o.status}" for _, o in counted if not o.ok}),
    }


def weight_column(state: str) -> str:
    """The weights HAProxy ended the round with, in server order (`show servers state`: field 8 is the weight)."""
    rows = [line.split() for line in state.splitlines() if line and not line.startswith("#") and len(line.split()) > 8]
    return "/".join(row[7] for row in rows)


def median_row(rounds: list[dict]) -> dict:
    row = dict(rounds[0])
    for key, value in row.items():
        if isinstance(value, float | int) and key != "policy":
            row[key] = statistics.median(r[key] for r in rounds)
    return row


async def run(args) -> int:
    requests = workload(max(200, math.ceil(args.load * 60 * (args.warmup + args.seconds) * 1.2)), args.seed)
    full = capacity(requests, args.pace, args.speeds)
    rate = args.load * full
    print(
        f"routing: {len(args.speeds)} replicas ({sum(s < 1 for s in args.speeds)} at half speed), "
        f"{args.pace.slots} slots each, {args.pace.decode_tps:g} tokens/s per slot, prefill {args.pace.prefill_tps:g} "
        f"tokens/s; capacity {full:.1f} requests/s, offered {rate:.1f}/s ({args.load:.0%}) for "
        f"{args.warmup:g} + {args.seconds:g} s per round, {args.runs} run(s)",
        flush=True,
    )
    rounds: dict[str, list[dict]] = {policy: [] for policy in args.policies}
    for run_number in range(args.runs):
        for policy in args.policies:
            result = await one_policy(policy, args, requests, rate)
            rounds[policy].append(result)
            print(
                f"  run {run_number + 1} {policy}: {result['requests']} requests, p50 {result['ttft_p50']:.0f} ms, "
                f"p99 {result['ttft_p99']:.0f} ms, {result['errors']} errors {'; '.join(result['failures'])}"
                f"(sent up to {result['late_ms_p99']:.1f} ms late at p99)",
                flush=True,
            )
    table = [median_row(r) for r in rounds.values()]
    print()
    print(
        "| policy | requests | errors | TTFT p50 | TTFT p99 | TTFT mean | requests/s | tokens/s "
        "| prompt cached | weights |"
    )
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |")
    for r in table:
        print(
            f"| {r['policy']} | {r['requests']} | {r['errors']} | {r['ttft_p50']:.0f} ms | {r['ttft_p99']:.0f} ms "
            f"| {r['ttft_mean']:.0f} ms | {r['requests_per_second']:.1f} | {r['tokens_per_second']:.0f} "
            f"| {r['cached_share']:.0%} | {r['weights'] or '-'} |"
        )
    results = [
        {"name": "capacity_requests_per_second", "value": round(full, 2), "unit": "requests/s", "target": None},
        {"name": "offered_requests_per_second", "value": round(rate, 2), "unit": "requests/s", "target": None},
    ]
    for r in table:
        for key, unit, better in (
            ("ttft_p50", "ms", "lower"),
            ("ttft_p99", "ms", "lower"),
            ("requests_per_second", "requests/s", "higher"),
            ("tokens_per_second", "tokens/s", "higher"),
            ("cached_share", "ratio", "higher"),
            ("errors", "requests", "lower"),
        ):
            value = round(r[key], 3 if unit == "ratio" else 1)
            name = f"{r['policy']}_{key}"
            results.append({"name": name, "value": value, "unit": unit, "target": None, "better": better})
    by_policy = {r["policy"]: r for r in table}
    missed = []
    if {"leastconn", "roundrobin"} <= by_policy.keys():
        ratio = by_policy["leastconn"]["ttft_p99"] / by_policy["roundrobin"]["ttft_p99"]
        results.append(
            {"name": "leastconn_to_roundrobin_ttft_p99", "value": round(ratio, 3), "unit": "ratio", "target": 0.5}
        )
        if not ratio <= 0.5:
            missed.append(f"leastconn's p99 TTFT is {ratio:.2f} of roundrobin's (target ≤ 0.5)")
    for row in results:
        row.setdefault("better", "lower")
    if args.quick:
        print("\n(--quick: bench/results/ left as it was)")
    else:
        write_results("routing", results)
    for line in missed:
        print(f"missed: {line}")
    # A request that failed means the setup is broken, not that a policy is slow: no figure stands.
    failed = sum(r["errors"] for r in table)
    if failed:
        print(f"failed: {failed} requests answered with an error")
    return 1 if failed else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=25.0, help="counted arrivals per round (default 25)")
    parser.add_argument("--warmup", type=float, default=5.0, help="arrivals sent first and not counted (default 5)")
    parser.add_argument("--load", type=float, default=0.8, help="offered load, a share of capacity (default 0.8)")
    parser.add_argument("--replicas", type=int, default=8)
    parser.add_argument("--slow", type=int, default=2, help="replicas at half speed (default 2)")
    parser.add_argument("--runs", type=int, default=1, help="rounds of every policy; the table holds the medians")
    parser.add_argument("--policy", action="append", choices=ROUTING_POLICIES, help="only these (default all)")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--quick", action="store_true", help="a few seconds on 3 replicas, to see it run")
    args = parser.parse_args(argv)
    if args.quick:
        args.replicas, args.slow, args.seconds, args.warmup = 3, 1, 2.0, 0.5
    args.policies = args.policy or list(ROUTING_POLICIES)
    args.speeds = [1.0] * (args.replicas - args.slow) + [0.5] * args.slow
    args.pace = Pace(slots=4, decode_tps=100, prefill_tps=4000, cache_tokens=16384)
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    return asyncio.run(run(args))


if __name__ == "__main__":
    sys.exit(main())
