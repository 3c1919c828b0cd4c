"""Fair under pressure: a light tenant's time to first token while another floods the same model.

    python -m bench.fairness [--seconds 20] [--warmup 5] [--flood 4] [--runs 1] [--quick]

Stand-in engines with real queueing (bench/standin/engine.py: 2 replicas of 4 slots, 50
tokens/s a slot, prefill 2,000 tokens/s) behind the real gateway (deploy/gateway.cfg rendered
by gateway.haproxy_config, its servers and fair shares programmed by the gateway's own sync,
a pass a second as gateway_sync runs it). Tenant B, light, keeps 2 streams going (each a
unique 200-word prompt, 32 tokens back); tenant A, flooding, keeps `--flood` times the model's
capacity (8 streams) going, 64 tokens each, and waits the Retry-After of a 429 before sending
again, as OpenAI's clients do (from a process of its own, so that its clients do not slow
the light tenant's measuring). Three rounds, each on a fresh fleet and gateway:

- `alone`: B only, the deployment's max in flight per replica at its slots (4): what B gets alone;
- `fair`: A floods, B as before, the same deployment: the fairness rules at work;
- `unfair`: the same two tenants, no max in flight (as the gateway was: the engines queue,
  first come first served).

The flood starts first; B's time to first token counts requests sent after its own first
`--warmup` seconds (which cover the moment a light tenant appears beside a flood, until the
sync's next passes have set the fair share and the flood's excess has drained).
With `--runs N` the three rounds run N times, interleaved, and the table holds each figure's
median over the runs. Target: B's p99 in `fair` at most 1.5 times its p99 `alone`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import random
import statistics
import sys
import time
from dataclasses import dataclass, field

from bench.agent_cost import ROOT, write_results
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


@dataclass
class Deadline:
    """When a tenant's clients stop sending: set once known (the flood's, when the light tenant has had its time)."""

    at: float = math.inf


async def tenant_loop(
    port: int, key: str, streams: int, max_tokens: int, until: Deadline, seed: int, seen: Tenant
) -> None:
    """`streams` clients each sending its next request when the last is answered, until `until`;
    a 429 is waited out for its Retry-After (1 s), as OpenAI's clients do."""
    pool = client.Pool(port)

    async def one(n: int) -> None:
        rng = random.Random(seed * 1000 + n)
        while time.perf_counter() < until.at:
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


class FloodProcess:
    """The flood from a process of its own, so that its 32 clients do not slow the light tenant's measuring:
    started first, flooding by the time `start` returns, stopped by `stop`, which returns what it saw."""

    def __init__(self, port: int, streams: int):
        self.port, self.streams = port, streams
        self.child: asyncio.subprocess.Process | None = None

    async def start(self) -> None:
        command = ["-m", "bench.fairness", "--flood-child", str(self.port), str(self.streams)]
        self.child = child = await asyncio.create_subprocess_exec(
            sys.executable, *command, cwd=ROOT, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE
        )
        assert child.stdout is not None
        ready = await asyncio.wait_for(child.stdout.readline(), 60)
        if ready.strip() != b"flooding":
            raise RuntimeError(f"the flood's process did not start: {ready!r}")

    async def stop(self) -> dict:
        child = self.child
        assert child is not None and child.stdin is not None
        child.stdin.write(b"stop\n")
        await child.stdin.drain()
        out, _ = await child.communicate()
        if child.returncode:
            raise RuntimeError(f"the flood's process failed ({child.returncode})")
        return json.loads(out.decode().strip().splitlines()[-1])


async def flood_child(port: int, streams: int) -> None:
    """The child's side: floods until a line comes on its stdin, then prints what it saw as one line of JSON."""
    seen, until, began = Tenant(), Deadline(), time.perf_counter()
    flooding = asyncio.create_task(tenant_loop(port, KEYS["flood"], streams, FLOOD_TOKENS, until, 2, seen))
    # Its clients have all sent their first request: the parent starts the light tenant now.
    await asyncio.sleep(0.5)
    print("flooding", flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
    until.at = time.perf_counter()
    await flooding
    seconds = time.perf_counter() - began
    good = [o for o in seen.outcomes if o.ok]
    failures = sorted({o.error or f"HTTP {o.status}" for o in seen.outcomes if not o.ok})
    summary = {
        "requests_per_second": len(good) / seconds,
        "tokens_per_second": sum(o.completion_tokens for o in good) / seconds,
        "refused_per_second": seen.refused / seconds,
        "errors": len(seen.outcomes) - len(good),
        "failures": failures,
    }
    print(json.dumps(summary), flush=True)


async def one_round(name: str, args, flood: bool, fair: bool) -> dict:
    servers_limit = PACE.slots if fair else 0
    with Fleet([1.0] * REPLICAS, PACE, MODEL, api_key=SECRET) as fleet:
        wanted = desired({MODEL: fleet.servers()}, SECRET, KEYS, max_in_flight=servers_limit)
        with RealGateway(wanted, sync_every=1.0) as gateway:
            flooding: dict = {
                "requests_per_second": 0.0,
                "tokens_per_second": 0.0,
                "refused_per_second": 0.0,
                "errors": 0,
                "failures": [],
            }
            flood_clients = FloodProcess(gateway.port, args.flood * PACE.slots * REPLICAS) if flood else None
            if flood_clients:
                await flood_clients.start()
            # The light tenant appears beside the flood (or alone): its first `warmup` seconds are not counted.
            started = time.perf_counter()
            light = Tenant()
            until = Deadline(started + args.warmup + args.seconds)
            await tenant_loop(gateway.port, KEYS["light"], LIGHT_STREAMS, LIGHT_TOKENS, until, 1, light)
            shares = gateway.ask(f"show map {gateway.paths.fair_map}").strip()
            if flood_clients:
                flooding = await flood_clients.stop()
    counted = light.counted(started + args.warmup)
    good = [o for o in counted if o.ok]
    ttft = [o.ttft * 1000 for o in good]
    return {
        "round": name,
        "light_requests": len(counted),
        "light_errors": len(counted) - len(good),
        "light_refused": light.refused,
        "light_ttft_p50": client.quantile(ttft, 0.5),
        "light_ttft_p99": client.quantile(ttft, 0.99),
        # Over the flood's whole run (from before the light tenant came until after it left).
        "flood_requests_per_second": flooding["requests_per_second"],
        "flood_tokens_per_second": flooding["tokens_per_second"],
        "flood_refused_per_second": flooding["refused_per_second"],
        "flood_errors": flooding["errors"],
        "failures": sorted(
            {o.error or f"HTTP {o.status}" for o in light.outcomes if not o.ok} | {*flooding["failures"]}
        ),
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
    # The flood's own process (FloodProcess): PORT STREAMS.
    parser.add_argument("--flood-child", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.quick:
        args.seconds, args.warmup = 4.0, 3.0
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    if args.flood_child:
        port, streams = args.flood_child
        asyncio.run(flood_child(int(port), int(streams)))
        return 0
    return asyncio.run(run(args))


if __name__ == "__main__":
    sys.exit(main())
