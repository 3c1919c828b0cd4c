"""Fair under pressure: a light tenant's time to first token while another floods the same model.

    python -m bench.fairness [--seconds 20] [--warmup 5] [--flood 4] [--runs 1] [--quick]

Stand-in engines with real queueing (bench/standin/engine.py: 2 replicas of 4 slots, 50
tokens/s a slot, prefill 2,000 tokens/s) behind the real gateway (deploy/gateway.cfg rendered
by gateway.haproxy_config, its servers and fair shares programmed by the gateway's own sync,
a pass a second as gateway_sync runs it). Tenant B, light, keeps 2 streams going (each a
unique 200-word prompt, 32 tokens back); tenant A, flooding, keeps `--flood` times the model's
capacity (8 streams) going, 64 tokens each, and waits the Retry-After of a 429 before sending
again, as OpenAI's clients do. Three rounds, each on a fresh fleet and gateway:

- `alone`: B only, the deployment's max in flight per replica at its slots (4): what B gets alone;
- `fair`: A floods, B as before, the same deployment: the fairness rules at work;
- `unfair`: the same two tenants, no max in flight (as the gateway was: the engines queue,
  first come first served).

B's time to first token counts requests sent after `--warmup` seconds of the round (A and B
start together, so the warm-up also covers the moment a light tenant appears beside a flood).
With `--runs N` the three rounds run N times, interleaved, and the table holds each figure's
median over the runs. Target: B's p99 in `fair` at most 1.5 times its p99 `alone`.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import random
import statistics
import sys
import time
from dataclasses import dataclass, field

from bench.agent_cost import write_results
from bench.standin import client
from bench.standin.engine import Pace
from bench.standin.fleet import Fleet
from bench.standin.real_gateway import RealGateway, desired

MODEL = "standin"
SECRET = "bench-fairness-engine-secret"
KEYS = {"flood": "llmgw-sk-bench-flood", "light": "llmgw-sk-bench-light"}
PACE = Pace(slots=4, decode_tps=50, prefill_tps=2000, cache_tokens=16384)
REPLICAS = 2
LIGHT_STREAMS = 2
PROMPT_WORDS = 200
LIGHT_TOKENS = 32
FLOOD_TOKENS = 64
TARGET = 1.5


@dataclass
class Tenant:
    """What one tenant's clients saw in a round."""

    outcomes: list[client.Outcome] = field(default_factory=list)
    refused: int = 0

    def counted(self, after: float) -> list[client.Outcome]:
        return [o for o in self.outcomes if o.sent >= after]


def request(rng: random.Random, key: str, max_tokens: int) -> bytes:
    """A unique prompt (no prefix cache helps it), streamed back."""
    words = " ".join(f"w{rng.randrange(1 << 30)}" for _ in range(PROMPT_WORDS))
    body = client.chat_body(MODEL, [{"role": "user", "content": words}], max_tokens)
    return client.request_bytes("/v1/chat/completions", body, key)


async def tenant_loop(
    port: int, key: str, streams: int, max_tokens: int, until: float, seed: int, seen: Tenant
) -> None:
    """`streams` clients each sending its next request when the last is answered, until `until`;
    a 429 is waited out for its Retry-After (1 s), as OpenAI's clients do."""
    pool = client.Pool(port)

    async def one(n: int) -> None:
        rng = random.Random(seed * 1000 + n)
        while time.perf_counter() < until:
            outcome = await client.send(pool, request(rng, key, max_tokens))
            if outcome.status == 429:
                seen.refused += 1
                await asyncio.sleep(1.0)
                continue
            seen.outcomes.append(outcome)

    try:
        await asyncio.gather(*(one(n) for n in range(streams)))
    finally:
        pool.close()


async def one_round(name: str, args, flood: bool, fair: bool) -> dict:
    servers_limit = PACE.slots if fair else 0
    with Fleet([1.0] * REPLICAS, PACE, MODEL, api_key=SECRET) as fleet:
        wanted = desired({MODEL: fleet.servers()}, SECRET, KEYS, max_in_flight=servers_limit)
        with RealGateway(wanted, sync_every=1.0) as gateway:
            started = time.perf_counter()
            until = started + args.warmup + args.seconds
            light, flooding = Tenant(), Tenant()
            tasks = [tenant_loop(gateway.port, KEYS["light"], LIGHT_STREAMS, LIGHT_TOKENS, until, 1, light)]
            if flood:
                streams = args.flood * PACE.slots * REPLICAS
                tasks.append(tenant_loop(gateway.port, KEYS["flood"], streams, FLOOD_TOKENS, until, 2, flooding))
            await asyncio.gather(*tasks)
            finished = time.perf_counter()
            shares = gateway.ask(f"show map {gateway.paths.fair_map}").strip()
    counted = light.counted(started + args.warmup)
    good = [o for o in counted if o.ok]
    ttft = [o.ttft * 1000 for o in good]
    flood_good = [o for o in flooding.outcomes if o.ok]
    seconds = finished - started
    return {
        "round": name,
        "light_requests": len(counted),
        "light_errors": len(counted) - len(good),
        "light_refused": light.refused,
        "light_ttft_p50": client.quantile(ttft, 0.5),
        "light_ttft_p99": client.quantile(ttft, 0.99),
        "flood_requests_per_second": len(flood_good) / seconds,
        "flood_tokens_per_second": sum(o.completion_tokens for o in flood_good) / seconds,
        "flood_refused_per_second": flooding.refused / seconds,
        "flood_errors": sum(not o.ok for o in flooding.outcomes),
        "failures": sorted({o.error or f"HTTP {o.status}" for o in light.outcomes + flooding.outcomes if not o.ok}),
        "fair_map": shares.split(" ", 1)[-1] if shares else "",
    }


def median_row(rows: list[dict]) -> dict:
    """The runs of one round: each figure their median (errors: their sum)."""
    row = dict(rows[0])
    for key, value in row.items():
        if isinstance(value, int | float):
            values = [r[key] for r in rows if not math.isnan(r[key])]
            summed = key.endswith(("errors", "refused"))
            row[key] = sum(values) if summed else statistics.median(values) if values else math.nan
    return row


async def run(args) -> int:
    capacity = PACE.slots * REPLICAS
    print(
        f"fairness: {REPLICAS} replicas of {PACE.slots} slots ({capacity} streams), {PACE.decode_tps:g} tokens/s a "
        f"slot, prefill {PACE.prefill_tps:g} tokens/s; light tenant {LIGHT_STREAMS} streams of {LIGHT_TOKENS} tokens, "
        f"flood {args.flood * capacity} streams of {FLOOD_TOKENS}; {args.warmup:g} + {args.seconds:g} s a round, "
        f"{args.runs} run(s)",
        flush=True,
    )
    rounds = [("alone", False, True), ("fair", True, True), ("unfair", True, False)]
    seen: dict[str, list[dict]] = {name: [] for name, _, _ in rounds}
    for run_number in range(args.runs):
        for name, flood, fair in rounds:
            row = await one_round(name, args, flood, fair)
            seen[name].append(row)
            print(
                f"  run {run_number + 1} {name}: light {row['light_requests']} requests, "
                f"TTFT p50 {row['light_ttft_p50']:.0f} ms, "
                f"p99 {row['light_ttft_p99']:.0f} ms; flood {row['flood_requests_per_second']:.1f} requests/s, "
                f"{row['flood_refused_per_second']:.1f} refused/s; fair.map {row['fair_map'] or '-'}"
                f"{'; failures: ' + ', '.join(row['failures']) if row['failures'] else ''}",
                flush=True,
            )
    table = [median_row(rows) for rows in seen.values()]
    by = {row["round"]: row for row in table}
    alone = by["alone"]["light_ttft_p99"]
    print()
    print(
        "| round | light TTFT p50 | light TTFT p99 | p99 ÷ alone | flood requests/s | flood tokens/s | flood 429/s "
        "| errors |"
    )
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for row in table:
        print(
            f"| {row['round']} | {row['light_ttft_p50']:.0f} ms | {row['light_ttft_p99']:.0f} ms "
            f"| {row['light_ttft_p99'] / alone:.2f} | {row['flood_requests_per_second']:.1f} "
            f"| {row['flood_tokens_per_second']:.0f} | {row['flood_refused_per_second']:.1f} "
            f"| {row['light_errors'] + row['flood_errors']} |"
        )
    results = []
    for row in table:
        for key, unit, better in (
            ("light_ttft_p50", "ms", "lower"),
            ("light_ttft_p99", "ms", "lower"),
            ("flood_requests_per_second", "requests/s", "higher"),
            ("flood_tokens_per_second", "tokens/s", "higher"),
            ("flood_refused_per_second", "requests/s", "lower"),
        ):
            if row["round"] == "alone" and key.startswith("flood"):
                continue
            results.append(
                {
                    "name": f"{row['round']}_{key}",
                    "value": round(row[key], 1),
                    "unit": unit,
                    "target": None,
                    "better": better,
                }
            )
    ratio = by["fair"]["light_ttft_p99"] / alone
    unfair = by["unfair"]["light_ttft_p99"] / alone
    results.append(
        {
            "name": "fair_to_alone_light_ttft_p99",
            "value": round(ratio, 2),
            "unit": "ratio",
            "target": TARGET,
            "better": "lower",
        }
    )
    results.append(
        {
            "name": "unfair_to_alone_light_ttft_p99",
            "value": round(unfair, 2),
            "unit": "ratio",
            "target": None,
            "better": "lower",
        }
    )
    if args.quick:
        print("\n(--quick: bench/results/ left as it was)")
    else:
        write_results("fairness", results)
    if not ratio <= TARGET:
        print(f"missed: the light tenant's p99 beside the flood is {ratio:.2f} times its p99 alone (target ≤ {TARGET})")
    failed = sum(row["light_errors"] + row["flood_errors"] + row["light_refused"] for row in table)
    if failed:
        print(f"failed: {failed} requests answered with an error (or the light tenant refused)")
    return 1 if failed or math.isnan(ratio) else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=20.0, help="counted seconds a round (default 20)")
    parser.add_argument("--warmup", type=float, default=5.0, help="seconds first, not counted (default 5)")
    parser.add_argument("--flood", type=int, default=4, help="the flood's streams, times the capacity (default 4)")
    parser.add_argument("--runs", type=int, default=1, help="runs of the three rounds; the table holds the medians")
    parser.add_argument("--quick", action="store_true", help="a few seconds a round, to see it run")
    args = parser.parse_args(argv)
    if args.quick:
        args.seconds, args.warmup = 4.0, 3.0
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    return asyncio.run(run(args))


if __name__ == "__main__":
    sys.exit(main())
