"""What the gateway costs a request: added latency and time to first token, a core's rate, memory at 1,000 streams.

    python -m bench.gateway [--rounds 5] [--no-litellm] [--quick]

One client (bench/standin/client.py) calls the same stand-in engine three ways, in
turns within each round so a busy moment of the shared machine hits all alike:

- direct: the engine itself, with its replica secret;
- gateway: HAProxy configured as the gateway (`nbthread 1`; a tenant's key checked as
  a SHA-256 digest in a map of 1,000 keys; the backend chosen from the body's `model`
  through a map; leastconn; `retry-on conn-failure empty-response 503` with
  `option redispatch`; `option http-no-delay`; the replica secret put on the way out);
- litellm: LiteLLM's proxy (`litellm[proxy]==1.108.7`, its own venv in var/, installed
  on the first run) with its master key.

Measured:

1. added latency: a streamed chat completion of 8 tokens from an engine that answers at
   once, request to `[DONE]`, at 1 and at 64 concurrent streams; each path's p50 and p99
   less the direct path's (targets: the gateway's p50 ≤ 200 µs, and at least 50 times
   less than LiteLLM's);
2. time to first token, streaming, from an engine pacing its tokens (50 ms of prefill,
   20 tokens/s), where a proxy that holds small writes back would show;
3. requests per second one gateway core carries: requests answered over HAProxy's CPU
   seconds (all threads, from schedstat) during the gateway's 64-stream phases;
4. HAProxy's resident memory with 1,000 streams open through it, against idle.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import sys
import time
from pathlib import Path

import psutil

from bench.agent_cost import cpu_ns, write_results
from bench.standin import client, litellm
from bench.standin.engine import Pace
from bench.standin.fleet import Fleet
from bench.standin.proxy import GATEWAY_BUFSIZE, HAProxy, gateway_config, write_maps

MODEL = "standin"
TENANT_KEY = "llmgw-bench-tenant-key"
REPLICA_SECRET = "replica-secret-bench"
MASTER_KEY = "sk-bench-master-key"
OTHER_TENANTS = 999
# An engine that answers at once, so what is measured is what sits in front of it.
INSTANT = Pace(slots=4096, decode_tps=0, prefill_tps=0, cache_tokens=0)
# 64 streams open at once, each a token every 20 ms: the machine is not saturated, so what the
# gateway adds to each stream is seen, not the CPU it takes from the client and the engine.
STREAMING = Pace(slots=4096, decode_tps=50, prefill_tps=0, cache_tokens=0)
# An engine pacing its tokens, for time to first token: 200 prompt tokens at 4,000/s is 50 ms.
PACED = Pace(slots=4096, decode_tps=20, prefill_tps=4000, cache_tokens=0)
# Streams held open: a token a second each, so a thousand of them cost the engine little.
TRICKLE = Pace(slots=4096, decode_tps=1, prefill_tps=4000, cache_tokens=0)
# Memory with streams open is measured at the gateway's buffer size and at HAProxy's default.
DEFAULT_BUFSIZE = 16384
QUESTION = [{"role": "user", "content": " ".join(["Name three colours."] * 50)}]


class Route:
    """One way to the engine: a pool of connections and the bearer token it takes."""

    def __init__(self, name: str, port: int, key: str, pid: int | None = None):
        self.name, self.pool, self.key, self.pid = name, client.Pool(port), key, pid

    def request(self, max_tokens: int, stream: bool = True) -> bytes:
        body = client.chat_body(MODEL, QUESTION, max_tokens, stream)
        return client.request_bytes("/v1/chat/completions", body, self.key)


def summary(outcomes: list[client.Outcome]) -> dict:
    good = [o for o in outcomes if o.ok]
    total = [o.total * 1e6 for o in good]
    ttft = [o.ttft * 1e6 for o in good]
    return {
        "count": len(outcomes),
        "errors": len(outcomes) - len(good),
        "p50": client.quantile(total, 0.5),
        "p99": client.quantile(total, 0.99),
        "ttft_p50": client.quantile(ttft, 0.5),
        "ttft_p99": client.quantile(ttft, 0.99),
    }


async def added_latency(paths: list[Route], concurrency: int, counts: dict[str, int], rounds: int) -> dict:
    """Each path's outcomes over `rounds` turns, and its CPU (if it has a pid) over its own turns."""
    outcomes: dict[str, list[client.Outcome]] = {p.name: [] for p in paths}
    cpu = dict.fromkeys(outcomes, 0)
    for path in paths:  # warm: connections open, caches filled
        await client.closed_loop(path.pool, lambda _, p=path: p.request(8), concurrency, concurrency * 4)
    for _ in range(rounds):
        for path in paths:
            before = cpu_tree(path.pid)
            outcomes[path.name] += await client.closed_loop(
                path.pool, lambda _, p=path: p.request(8), concurrency, max(1, counts[path.name] // rounds)
            )
            cpu[path.name] += cpu_tree(path.pid) - before
    return {name: {**summary(found), "cpu_ns": cpu[name]} for name, found in outcomes.items()}


def cpu_tree(pid: int | None) -> int:
    """CPU ns of a process and its children (LiteLLM's uvicorn worker is a child of its launcher)."""
    if pid is None:
        return 0
    total = 0
    try:
        processes = [psutil.Process(pid), *psutil.Process(pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        return 0
    for process in processes:
        try:
            total += cpu_ns(process.pid)
        except OSError:
            continue
    return total


def rss_tree(pid: int) -> int:
    try:
        processes = [psutil.Process(pid), *psutil.Process(pid).children(recursive=True)]
        return sum(p.memory_info().rss for p in processes)
    except psutil.NoSuchProcess:
        return 0


async def first_tokens(paths: list[Route], count: int) -> dict:
    """Time to first token from the paced engine, one stream at a time, paths in turns."""
    found: dict[str, list[client.Outcome]] = {p.name: [] for p in paths}
    for path in paths:
        await client.send(path.pool, path.request(2))
    for _ in range(count):
        for path in paths:
            found[path.name].append(await client.send(path.pool, path.request(2)))
    return {name: summary(outcomes) for name, outcomes in found.items()}


async def open_streams(port: int, streams: int, pid: int) -> tuple[int, int, int]:
    """HAProxy's RSS idle and with `streams` streams open through it, each on its own connection; how many opened."""
    idle = psutil.Process(pid).memory_info().rss
    body = client.chat_body(MODEL, QUESTION, 120)
    request = client.request_bytes("/v1/chat/completions", body, TENANT_KEY)
    connections = []
    first_token = 0

    async def one() -> None:
        nonlocal first_token
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        connections.append(writer)
        writer.write(request)
        await reader.readuntil(b"data: ")
        first_token += 1
        while await reader.read(1 << 16):
            pass

    tasks = [asyncio.create_task(one()) for _ in range(streams)]
    deadline = time.monotonic() + 60
    while first_token < streams and time.monotonic() < deadline:
        await asyncio.sleep(0.1)
    held = psutil.Process(pid).memory_info().rss
    opened = first_token
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    for writer in connections:
        writer.close()
    return idle, held, opened


def gateway(fleet: Fleet, nbthread: int = 1, bufsize: int | None = None):
    def render(port: int, sock: Path) -> str:
        maps = sock.parent / "maps"
        keys = {"bench": TENANT_KEY, **{f"tenant-{i}": f"key-{i}" for i in range(OTHER_TENANTS)}}
        write_maps(maps, keys, [MODEL])
        return gateway_config(
            port, {MODEL: fleet.servers()}, sock, maps, REPLICA_SECRET, nbthread=nbthread, bufsize=bufsize
        )

    return HAProxy(render)


async def compare(args, pace: Pace, use_litellm: bool, run) -> dict:
    """`run(routes)` on the direct path, the gateway and (if used) LiteLLM, all in front of one engine at `pace`."""
    with Fleet([1.0], pace, api_key=REPLICA_SECRET) as fleet, gateway(fleet) as proxy:
        (engine_port,) = fleet.ports
        routes = [Route("direct", engine_port, REPLICA_SECRET), Route("gateway", proxy.port, TENANT_KEY, proxy.pid)]
        peer = None
        if use_litellm:
            peer = litellm.LiteLLM(MODEL, f"http://127.0.0.1:{engine_port}/v1", REPLICA_SECRET, MASTER_KEY)
            peer.__enter__()
            routes.append(Route("litellm", peer.port, MASTER_KEY, peer.pid))
        try:
            found = await run(routes)
            if peer:
                found["litellm_rss"] = rss_tree(peer.pid)
            return found
        finally:
            if peer:
                peer.__exit__()


async def measure(args) -> dict:
    results: dict = {}
    use_litellm = not args.no_litellm
    if use_litellm and not litellm.installed():
        litellm.install()
    print("  1 stream at a time, an engine answering at once…", flush=True)
    one = await compare(args, INSTANT, use_litellm, lambda routes: added_latency(routes, 1, args.counts_1, args.rounds))
    results[1] = {k: v for k, v in one.items() if k != "litellm_rss"}
    print("  64 streams at a time, a token every 20 ms…", flush=True)
    many = await compare(
        args, STREAMING, use_litellm, lambda routes: added_latency(routes, 64, args.counts_64, args.rounds)
    )
    results[64] = {k: v for k, v in many.items() if k != "litellm_rss"}
    if "litellm_rss" in many:
        results["litellm_rss"] = many["litellm_rss"]
    print("  time to first token, paced engine…", flush=True)

    async def ttft(routes):
        return {"ttft": await first_tokens(routes, args.ttft_count)}

    results["ttft"] = (await compare(args, PACED, use_litellm, ttft))["ttft"]
    for bufsize in (GATEWAY_BUFSIZE, DEFAULT_BUFSIZE):
        print(f"  {args.streams} streams open, tune.bufsize {bufsize}…", flush=True)
        with Fleet([1.0], TRICKLE, api_key=REPLICA_SECRET) as fleet, gateway(fleet, bufsize=bufsize) as proxy:
            results[f"rss_{bufsize}"] = await open_streams(proxy.port, args.streams, proxy.pid)
    return results


def report(results: dict, args) -> list[dict]:
    rows = []

    def add(name: str, value: float, unit: str, target: float | None = None, better: str = "lower") -> None:
        rows.append({"name": name, "value": round(value, 1), "unit": unit, "target": target, "better": better})

    print()
    print("| streams | path | requests | errors | p50 | p99 | added p50 | added p99 | TTFT p50 | CPU per request |")
    print("| ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for concurrency in (1, 64):
        by_path = results[concurrency]
        direct = by_path["direct"]
        for name, r in by_path.items():
            added50, added99 = r["p50"] - direct["p50"], r["p99"] - direct["p99"]
            cpu = r["cpu_ns"] / 1000 / r["count"] if name != "direct" and r["count"] else math.nan
            print(
                f"| {concurrency} | {name} | {r['count']} | {r['errors']} | {r['p50']:.0f} µs | {r['p99']:.0f} µs "
                f"| {added50:+.0f} µs | {added99:+.0f} µs | {r['ttft_p50']:.0f} µs | {cpu:.0f} µs |"
            )
            add(f"{name}_{concurrency}_streams_p50", r["p50"], "µs")
            add(f"{name}_{concurrency}_streams_p99", r["p99"], "µs")
            add(f"{name}_{concurrency}_streams_errors", r["errors"], "requests")
            if name != "direct":
                target = 200 if name == "gateway" and concurrency == 1 else None
                add(f"{name}_{concurrency}_streams_added_p50", added50, "µs", target)
                add(f"{name}_{concurrency}_streams_added_p99", added99, "µs")
                add(f"{name}_cpu_per_request_{concurrency}_streams", cpu, "µs")
    gateway_64 = results[64]["gateway"]
    per_core = gateway_64["count"] / (gateway_64["cpu_ns"] / 1e9) if gateway_64["cpu_ns"] else math.nan
    add("gateway_requests_per_core_second", per_core, "requests/s", better="higher")
    missed = []
    for concurrency in (1, 64):
        by_path = results[concurrency]
        if "litellm" in by_path:
            gw = by_path["gateway"]["p50"] - by_path["direct"]["p50"]
            ll = by_path["litellm"]["p50"] - by_path["direct"]["p50"]
            ratio = ll / gw if gw > 0 else math.inf
            add(f"litellm_to_gateway_added_p50_{concurrency}_streams", ratio, "ratio", 50, "higher")
            print(f"\nadded p50 at {concurrency} stream(s): LiteLLM's is {ratio:.0f}× the gateway's (target ≥ 50)")
            if ratio < 50:
                missed.append(f"LiteLLM/gateway added p50 at {concurrency} streams is {ratio:.0f} (target ≥ 50)")
    gw1 = results[1]["gateway"]["p50"] - results[1]["direct"]["p50"]
    if gw1 > 200:
        missed.append(f"gateway's added p50 at 1 stream is {gw1:.0f} µs (target ≤ 200)")
    print("\n| time to first token, paced engine | requests | p50 | p99 | added p50 |")
    print("| --- | ---: | ---: | ---: | ---: |")
    ttft = results["ttft"]
    for name, r in ttft.items():
        added = r["ttft_p50"] - ttft["direct"]["ttft_p50"]
        print(
            f"| {name} | {r['count']} | {r['ttft_p50'] / 1000:.2f} ms | {r['ttft_p99'] / 1000:.2f} ms "
            f"| {added / 1000:+.2f} ms |"
        )
        add(f"{name}_ttft_p50", r["ttft_p50"] / 1000, "ms")
        if name != "direct":
            add(f"{name}_ttft_added_p50", added / 1000, "ms")
    print()
    for bufsize in (GATEWAY_BUFSIZE, DEFAULT_BUFSIZE):
        idle, held, opened = results[f"rss_{bufsize}"]
        print(
            f"gateway, tune.bufsize {bufsize}: RSS {idle / 2**20:.1f} MiB idle, {held / 2**20:.1f} MiB with "
            f"{opened} streams open ({(held - idle) / max(opened, 1) / 1024:.1f} KiB a stream)"
        )
        add(f"gateway_rss_idle_bufsize_{bufsize}", idle / 2**20, "MiB")
        add(f"gateway_rss_{args.streams}_streams_bufsize_{bufsize}", held / 2**20, "MiB")
        add(f"gateway_streams_opened_bufsize_{bufsize}", opened, "streams", args.streams, "higher")
        if opened < args.streams:
            missed.append(f"only {opened} of {args.streams} streams opened (bufsize {bufsize})")
    print(f"gateway: {per_core:,.0f} streamed requests per core-second (HAProxy nbthread 1, 64 streams)")
    if "litellm_rss" in results:
        print(f"LiteLLM's proxy: RSS {results['litellm_rss'] / 2**20:.0f} MiB after its runs")
        add("litellm_rss", results["litellm_rss"] / 2**20, "MiB")
    for line in missed:
        print(f"missed: {line}")
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5, help="turns of the paths (default 5)")
    parser.add_argument("--requests", type=int, default=2000, help="per path at 1 stream, twice at 64 (default 2000)")
    parser.add_argument("--litellm-requests", type=int, default=500, help="LiteLLM's, per concurrency (default 500)")
    parser.add_argument("--ttft-requests", type=int, default=40, help="paced streams per path (default 40)")
    parser.add_argument("--streams", type=int, default=1000, help="held open for the memory figure (default 1000)")
    parser.add_argument("--no-litellm", action="store_true", help="leave LiteLLM out (no install, no comparison)")
    parser.add_argument("--quick", action="store_true", help="a few requests, no LiteLLM, to see it run")
    args = parser.parse_args(argv)
    if args.quick:
        args.rounds, args.requests, args.ttft_requests, args.streams, args.no_litellm = 2, 128, 3, 50, True
    args.counts_1 = {"direct": args.requests, "gateway": args.requests, "litellm": args.litellm_requests}
    args.counts_64 = {"direct": args.requests * 2, "gateway": args.requests * 2, "litellm": args.litellm_requests}
    args.ttft_count = args.ttft_requests
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    print(
        f"gateway: added latency over the engine, {args.rounds} rounds, "
        f"{'LiteLLM left out' if args.no_litellm else 'beside LiteLLM ' + litellm.PACKAGE}",
        flush=True,
    )
    results = asyncio.run(measure(args))
    rows = report(results, args)
    if args.quick:
        print("\n(--quick: bench/results/ left as it was)")
    else:
        write_results("gateway", rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
