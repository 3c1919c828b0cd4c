"""What the gateway costs a request: added latency and time to first token, a core's rate, memory at 1,000 streams.

    python -m bench.gateway [--rounds 5] [--requests 1500] [--wrk-seconds 2] [--no-litellm] [--no-wrk] [--quick]

Each route below is called in turns within each round, so that a busy moment of the
shared machine hits all alike:

- direct: the engine itself, with its replica secret;
- gateway: the gateway as production runs it (bench/standin/real_gateway.py): deploy/gateway.cfg
  rendered by gateway/haproxy_config.py (`nbthread 1`; a tenant's key checked as a SHA-256
  digest in a map of 1,000 keys; the backend chosen from the body's `model` through the
  models map; the 400/404/413 rules; leastconn; `retry-on conn-failure empty-response 503`
  with `option redispatch`; `option http-no-delay`; the engine secret put on the way out),
  HAProxy started as devstack starts it (glibc's allocator fixed), its servers added by the
  gateway's sync; `--max-body` at its default, 256 KiB (a 272 KiB buffer); its deployments
  vLLM's, so that its relay asks every stream for vLLM's running usage, a `usage` on every
  event, which the stand-ins send and the relay counts as production's vLLM streams are;
- gateway-norelay: the same as `gateway` with its streams sent straight to the backend instead of
  through the stream relay (deploy/gateway_relay.lua, which ends a cut stream with an SSE error
  event, and asks for the running usage): what the relay costs a stream (the Python client's
  phases only);
- litellm: LiteLLM's proxy (`litellm[proxy]==1.108.7`, its own venv in var/, installed
  on the first run) with its master key, serving the same models.

Two clients, two kinds of engine:

1. the Python client (bench/standin/client.py) against stand-in engines (`instant`
   answers at once, `paced` spends 50 ms on the prompt and then sends 20 tokens a second):
   added latency at 1 stream (a streamed chat completion of 8 tokens, request to
   `[DONE]` and to the first token, and the same answer not streamed), time to first
   token from `paced`, the requests one gateway core carries (requests over HAProxy's CPU
   seconds with 64 at once against `instant`), HAProxy's memory with 1,000 streams open;
2. `wrk` (C, one thread; bench/standin/wrk.py) against an engine that costs almost nothing
   (HAProxy answering from memory: a chat completion, the same as SSE chunks, or that
   stream paced over 50 ms), at 1 and 64 connections: each round's p50 and p99 less the
   direct run's just before it, the median over the rounds (targets: the gateway's added
   p50 ≤ 200 µs, LiteLLM's at least 50 times the gateway's), with the proxy's CPU and its
   wait for a CPU (schedstat) a request. Without `wrk` on PATH these are left out.

For the stream relay, the Python client's phases also measure: HAProxy's CPU per streamed chunk
(the core's rate with streams of LONG_TOKENS tokens against those of 8: the difference in CPU a
request over the difference in chunks); the relay's cost a stream, paired (streams of 8 tokens
from `instant`, one at a time, alternating request by request between `gateway` and
`gateway-norelay`, which goes first alternating too; the median of the pairs' differences, to
the first token and to the end); and the memory with 1,000 streams open without the relay.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import math
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import psutil

from agent import enginekinds
from bench.agent_cost import cpu_ns, write_results
from bench.standin import client, litellm, wrk
from bench.standin.engine import Pace
from bench.standin.fleet import Fleet
from bench.standin.proxy import Server as StandinServer
from bench.standin.real_gateway import RealGateway, desired
from gateway.haproxy_config import MAX_BODY, Frontend

TENANT_KEY = "llmgw-bench-tenant-key"
REPLICA_SECRET = "replica-secret-bench"
MASTER_KEY = "sk-bench-master-key"
OTHER_TENANTS = 999
PACES = {
    "instant": Pace(slots=4096, decode_tps=0, prefill_tps=0, cache_tokens=0),
    # 200 prompt tokens at 4,000 a second: the first token after 50 ms.
    "paced": Pace(slots=4096, decode_tps=20, prefill_tps=4000, cache_tokens=0),
}
# Streams held open for the memory figure: a token a second each, so a thousand cost the engine little.
TRICKLE = Pace(slots=4096, decode_tps=1, prefill_tps=4000, cache_tokens=0)
# A smaller body limit: the buffer, sized from the limit, is most of the gateway's memory per open stream
# and much of its CPU per request, but the stream relay keeps it at the default's size whatever the limit
# (gateway.haproxy_config.RELAY_BUFSIZE), so only the gateway without the relay is measured at it.
SMALL_BODY = 16384
NORELAY = "gateway-norelay"
GATEWAYS = ("gateway", NORELAY)
# The long streams of the core's rate: with the short ones (TOKENS), HAProxy's CPU per chunk.
LONG_TOKENS = 128
QUESTION = [{"role": "user", "content": " ".join(["Name three colours."] * 50)}]
# What the relay adds to a stream for a running usage: the gateway's deployments are vLLM's.
RUNNING_USAGE = enginekinds.get("vllm").running_usage
TOKENS = 8
# The fixed engine's models (bench/standin/wrk.py), one per way it answers; wrk's phases:
# (name, the engine's answer, connections, streamed).
FIXED = {"json": "fixed-json", "sse": "fixed-sse", "paced": "fixed-paced"}
WRK_PHASES = (
    ("wrk 1 whole", "json", 1, False),
    ("wrk 1 stream", "sse", 1, True),
    ("wrk 64 whole", "json", 64, False),
    ("wrk 64 stream", "sse", 64, True),
    ("wrk 64 paced", "paced", 64, True),
)


class Route:
    """One way to the engines: where each model is reached, and the bearer token it takes."""

    def __init__(self, name: str, ports: dict[str, int], key: str, pid: int | None = None):
        self.name, self.key, self.pid = name, key, pid
        self.pools = {model: client.Pool(port) for model, port in ports.items()}

    def request(self, model: str, max_tokens: int = TOKENS, stream: bool = True) -> bytes:
        body = client.chat_body(model, QUESTION, max_tokens, stream)
        return client.request_bytes("/v1/chat/completions", body, self.key)

    def requests(self, model: str, stream: bool, max_tokens: int = TOKENS) -> Callable[[int], bytes]:
        """What a client loop sends: the same request, whatever its number."""
        return lambda _: self.request(model, max_tokens, stream=stream)


def summary(outcomes: list[client.Outcome], cpu: int = 0) -> dict:
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
        "cpu_ns": cpu,
    }


async def in_turns(
    routes: list[Route], model: str, stream: bool, concurrency: int, counts: dict, rounds: int, tokens: int = TOKENS
) -> dict:
    """Each route's outcomes over `rounds` turns, and its CPU (where it has a pid) over its own turns."""
    outcomes: dict[str, list[client.Outcome]] = {r.name: [] for r in routes}
    cpu = dict.fromkeys(outcomes, 0)
    for route in routes:  # warm: connections open, caches filled
        await client.closed_loop(
            route.pools[model], route.requests(model, stream, tokens), concurrency, concurrency * 2
        )
    for _ in range(rounds):
        for route in routes:
            before = cpu_tree(route.pid)
            outcomes[route.name] += await client.closed_loop(
                route.pools[model],
                route.requests(model, stream, tokens),
                concurrency,
                max(1, counts[route.name] // rounds),
            )
            cpu[route.name] += cpu_tree(route.pid) - before
    return {name: summary(found, cpu[name]) for name, found in outcomes.items()}


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


async def first_tokens(routes: list[Route], count: int) -> dict:
    """Time to first token from `paced`, one stream at a time, the routes in turns."""
    found: dict[str, list[client.Outcome]] = {r.name: [] for r in routes}
    for route in routes:
        await client.send(route.pools["paced"], route.request("paced", 2))
    for _ in range(count):
        for route in routes:
            found[route.name].append(await client.send(route.pools["paced"], route.request("paced", 2)))
    return {name: summary(outcomes) for name, outcomes in found.items()}


async def relay_pairs(relayed: Route, straight: Route, count: int) -> dict:
    """The relay's cost a stream: medians of paired differences (µs), the two routes alternating request by request."""
    found: dict[str, list[client.Outcome]] = {relayed.name: [], straight.name: []}
    for i in range(count + 20):  # the first 20 pairs warm both
        for route in (relayed, straight) if i % 2 else (straight, relayed):
            outcome = await client.send(route.pools["instant"], route.request("instant"))
            if i >= 20:
                found[route.name].append(outcome)
    pairs = [(a, b) for a, b in zip(found[relayed.name], found[straight.name], strict=True) if a.ok and b.ok]
    return {
        "pairs": len(pairs),
        "ttft": client.quantile([(a.ttft - b.ttft) * 1e6 for a, b in pairs], 0.5),
        "total": client.quantile([(a.total - b.total) * 1e6 for a, b in pairs], 0.5),
    }


async def open_streams(port: int, streams: int, pid: int) -> tuple[int, int, int]:
    """HAProxy's RSS idle and with `streams` streams open through it, each on its own connection; how many opened."""
    idle = psutil.Process(pid).memory_info().rss
    request = client.request_bytes("/v1/chat/completions", client.chat_body("trickle", QUESTION, 120), TENANT_KEY)
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


def gateway(
    fleets: dict[str, Fleet], max_body: int = MAX_BODY, fixed: dict[str, int] | None = None, relay: bool = True
) -> RealGateway:
    """The real gateway in front of the stand-in fleets and of the fixed engine's ports (a model each)."""
    keys = {"bench": TENANT_KEY, **{f"tenant-{i}": f"key-{i}" for i in range(OTHER_TENANTS)}}
    models = {model: fleet.servers() for model, fleet in fleets.items()}
    models |= {model: [StandinServer("r1", port)] for model, port in (fixed or {}).items()}
    return RealGateway(desired(models, REPLICA_SECRET, keys, running_usage=RUNNING_USAGE), max_body, relay=relay)


def schedstat_tree(pid: int | None) -> tuple[int, int]:
    """CPU ns and ns spent runnable but waiting for a CPU, of a process's threads and its children's."""
    if pid is None:
        return 0, 0
    try:
        pids = [pid, *(child.pid for child in psutil.Process(pid).children(recursive=True))]
    except psutil.NoSuchProcess:
        return 0, 0
    cpu = wait = 0
    for one in pids:
        with contextlib.suppress(OSError):
            for task in os.listdir(f"/proc/{one}/task"):
                with contextlib.suppress(OSError, ValueError, IndexError):
                    fields = Path(f"/proc/{one}/task/{task}/schedstat").read_text().split()
                    cpu, wait = cpu + int(fields[0]), wait + int(fields[1])
    return cpu, wait


def wrk_phases(routes: dict[str, tuple[int | dict[str, int], str, int | None]], args) -> dict:
    """Each wrk phase, the routes in turns within each round: {phase: {route: [one run's figures a round]}}.

    `routes` maps a route to its port (one for every model, or one per model), its bearer
    token and the pid of its proxy (None: direct), whose CPU and wait for a CPU each run records.
    """
    found: dict = {}
    scripts = Path(tempfile.mkdtemp(prefix="bench-wrk-"))
    for phase, answer, connections, stream in WRK_PHASES:
        model = FIXED[answer]
        lua = {
            name: wrk.script(scripts, f"{name}-{answer}", wrk.chat_body(model, stream), key)
            for name, (_, key, _) in routes.items()
        }

        def port(name: str, answer: str = answer) -> int:
            where = routes[name][0]
            return where[answer] if isinstance(where, dict) else where

        print(f"  {phase} ({model}, {connections} connection{'s' if connections > 1 else ''})…", flush=True)
        for name in routes:  # warm: connections opened, the proxies' pools filled
            wrk.run(port(name), lua[name], connections, 1)
            settle(routes[name][2])
        found[phase] = {name: [] for name in routes}
        for round_ in range(args.rounds):
            for name in routes:
                # LiteLLM answers tens of requests a second here: one longer run, in the first round.
                if name == "litellm" and round_:
                    continue
                seconds = args.litellm_seconds if name == "litellm" else args.wrk_seconds
                cpu, wait = schedstat_tree(routes[name][2])
                run = wrk.run(port(name), lua[name], connections, seconds, 30 if name == "litellm" else 10)
                after = schedstat_tree(routes[name][2])
                run["cpu_ns"], run["wait_ns"] = after[0] - cpu, after[1] - wait
                found[phase][name].append(run)
                settle(routes[name][2])
    return found


def settle(pid: int | None, seconds: float = 10.0) -> None:
    """Until a proxy is idle (under 5 % of a core over 100 ms): LiteLLM goes on with the requests
    wrk left in flight, which would otherwise fall on the next path's run."""
    deadline = time.monotonic() + seconds
    while pid is not None and time.monotonic() < deadline:
        before = schedstat_tree(pid)[0]
        time.sleep(0.1)
        if schedstat_tree(pid)[0] - before < 5_000_000:
            return


async def measure(args) -> dict:
    results: dict = {}
    use_litellm = not args.no_litellm
    if use_litellm and not litellm.installed():
        litellm.install()
    with contextlib.ExitStack() as stack:
        fleets = {
            model: stack.enter_context(Fleet([1.0], pace, model=model, api_key=REPLICA_SECRET))
            for model, pace in PACES.items()
        }
        ports = {model: fleet.ports[0] for model, fleet in fleets.items()}
        fixed = None
        if args.wrk:
            engine = stack.enter_context(wrk.FixedEngine(FIXED["json"]))
            fixed = {FIXED[answer]: port for answer, port in engine.ports.items()}
        proxy = stack.enter_context(gateway(fleets, fixed=fixed))
        norelay = stack.enter_context(gateway(fleets, relay=False))
        routes = [
            Route("direct", ports, REPLICA_SECRET),
            Route("gateway", dict.fromkeys(ports, proxy.port), TENANT_KEY, proxy.pid),
            Route(NORELAY, dict.fromkeys(ports, norelay.port), TENANT_KEY, norelay.pid),
        ]
        if use_litellm:
            upstreams = {model: f"http://127.0.0.1:{port}/v1" for model, port in {**ports, **(fixed or {})}.items()}
            print("  starting LiteLLM's proxy…", flush=True)
            peer = stack.enter_context(litellm.LiteLLM(upstreams, REPLICA_SECRET, MASTER_KEY))
            routes.append(Route("litellm", dict.fromkeys(ports, peer.port), MASTER_KEY, peer.pid))
        one, many = args.counts_1, args.counts_64
        print("  1 stream at a time…", flush=True)
        results["1 stream"] = await in_turns(routes, "instant", True, 1, one, args.rounds)
        results["1 whole"] = await in_turns(routes, "instant", False, 1, one, args.rounds)
        if args.wrk:
            by_wrk: dict[str, tuple[int | dict[str, int], str, int | None]] = {
                "direct": (engine.ports, REPLICA_SECRET, engine.pid),
                "gateway": (proxy.port, TENANT_KEY, proxy.pid),
            }
            if use_litellm:
                by_wrk["litellm"] = (peer.port, MASTER_KEY, peer.pid)
            results["load_before_wrk"] = os.getloadavg()
            results["wrk"] = wrk_phases(by_wrk, args)
            results["load_after_wrk"] = os.getloadavg()
        print("  time to first token…", flush=True)
        results["ttft"] = await first_tokens(routes, args.ttft_requests)
        if use_litellm:
            results["litellm_rss"] = rss_tree(peer.pid)
        print("  the relay's cost, paired…", flush=True)
        results["relay pairs"] = await relay_pairs(routes[1], routes[2], args.requests * 2)
        print("  a gateway core's rate…", flush=True)
        for kind, stream, tokens in (("stream", True, TOKENS), ("whole", False, TOKENS), ("long", True, LONG_TOKENS)):
            found = await in_turns(routes[1 : 1 + len(GATEWAYS)], "instant", stream, 64, many, 1, tokens)
            for name, figures in found.items():
                results[f"core {kind} {name}"] = figures
    for max_body, relay in MEMORY:
        print(f"  {args.streams} streams open, --max-body {max_body}{'' if relay else ', no relay'}…", flush=True)
        with contextlib.ExitStack() as stack:
            fleet = stack.enter_context(Fleet([1.0], TRICKLE, model="trickle", api_key=REPLICA_SECRET))
            proxy = stack.enter_context(gateway({"trickle": fleet}, max_body, relay=relay))
            results[memory_key(max_body, relay)] = await open_streams(proxy.port, args.streams, proxy.pid)
    return results


PHASES = ("1 stream", "1 whole")
# The memory figure's gateways: as production runs it; without the relay, at the default body limit and at
# the smaller one (what the relay's buffer costs a deployment with small prompts).
MEMORY = ((MAX_BODY, True), (MAX_BODY, False), (SMALL_BODY, False))


def memory_key(max_body: int, relay: bool) -> str:
    return f"rss_{max_body}" if relay else f"rss_{max_body}_norelay"


def report(results: dict, args) -> list[dict]:
    rows: list[dict] = []
    missed: list[str] = []

    def add(name: str, value: float, unit: str, target: float | None = None, better: str = "lower") -> None:
        rows.append({"name": name, "value": round(value, 1), "unit": unit, "target": target, "better": better})

    print()
    print(
        "| phase | path | requests | errors | p50 | p99 | added p50 | added p99 | TTFT p50 | added TTFT p50 "
        "| CPU a request |"
    )
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for phase in PHASES:
        by_route = results[phase]
        direct = by_route["direct"]
        slug = phase.replace(" ", "_")
        for name, r in by_route.items():
            added50, added99 = r["p50"] - direct["p50"], r["p99"] - direct["p99"]
            added_ttft = r["ttft_p50"] - direct["ttft_p50"]
            cpu = r["cpu_ns"] / 1000 / r["count"] if r["cpu_ns"] and r["count"] else math.nan
            print(
                f"| {phase} | {name} | {r['count']} | {r['errors']} | {r['p50']:.0f} µs | {r['p99']:.0f} µs "
                f"| {added50:+.0f} µs | {added99:+.0f} µs | {r['ttft_p50']:.0f} µs | {added_ttft:+.0f} µs "
                f"| {cpu:.0f} µs |"
            )
            add(f"{name}_{slug}_p50", r["p50"], "µs")
            add(f"{name}_{slug}_p99", r["p99"], "µs")
            add(f"{name}_{slug}_errors", r["errors"], "requests", 0)
            if r["errors"]:
                missed.append(f"{r['errors']} errors through {name} ({phase})")
            if name == "direct":
                continue
            target = 200 if name in GATEWAYS else None
            add(f"{name}_{slug}_added_p50", added50, "µs", target)
            add(f"{name}_{slug}_added_p99", added99, "µs")
            add(f"{name}_{slug}_added_ttft_p50", added_ttft, "µs")
            if not math.isnan(cpu):
                add(f"{name}_{slug}_cpu_per_request", cpu, "µs")
            if name in GATEWAYS and added50 > 200:
                missed.append(f"{name}'s added p50 ({phase}) is {added50:.0f} µs (target ≤ 200)")
        if "litellm" in by_route:
            gw = by_route["gateway"]["p50"] - direct["p50"]
            ll = by_route["litellm"]["p50"] - direct["p50"]
            if gw > 0:
                ratio = ll / gw
                add(f"litellm_to_gateway_added_p50_{slug}", ratio, "ratio", 50, "higher")
                print(f"| {phase} | LiteLLM's added p50 ÷ the gateway's | {ratio:.0f} (target ≥ 50) |")
                if ratio < 50:
                    missed.append(f"LiteLLM's added p50 ({phase}) is {ratio:.0f}× the gateway's (target ≥ 50)")
            else:
                # No ratio to a difference lost in the noise: the gateway added nothing measurable at p50.
                print(f"| {phase} | LiteLLM's added p50 ÷ the gateway's | none: the gateway's is ≤ 0 |")
    if "wrk" in results:
        report_wrk(results, args, add, missed)
    print("\n| time to first token, `paced` | requests | p50 | p99 | added p50 |")
    print("| --- | ---: | ---: | ---: | ---: |")
    ttft = results["ttft"]
    for name, r in ttft.items():
        added = r["ttft_p50"] - ttft["direct"]["ttft_p50"]
        print(
            f"| {name} | {r['count']} | {r['ttft_p50'] / 1000:.2f} ms | {r['ttft_p99'] / 1000:.2f} ms "
            f"| {added / 1000:+.2f} ms |"
        )
        add(f"{name}_paced_ttft_p50", r["ttft_p50"] / 1000, "ms")
        add(f"{name}_paced_ttft_p99", r["ttft_p99"] / 1000, "ms")
        if name != "direct":
            add(f"{name}_paced_added_ttft_p50", added / 1000, "ms")
    print()
    pairs = results["relay pairs"]
    print(
        f"the relay, paired over {pairs['pairs']} streams of {TOKENS} tokens (gateway less gateway-norelay, "
        f"median): {pairs['ttft']:+.0f} µs to the first token, {pairs['total']:+.0f} µs to the end"
    )
    add("relay_paired_added_ttft_p50", pairs["ttft"], "µs")
    add("relay_paired_added_total_p50", pairs["total"], "µs")
    print()
    what = {
        "stream": f"streamed answers of {TOKENS} tokens",
        "whole": "answers not streamed",
        "long": f"streamed answers of {LONG_TOKENS} tokens",
    }
    for name in GATEWAYS:
        cpu_a_request = {}
        for kind in what:
            r = results[f"core {kind} {name}"]
            per_core = r["count"] / (r["cpu_ns"] / 1e9) if r["cpu_ns"] else math.nan
            cpu_a_request[kind] = 1e6 / per_core
            print(f"{name}: {per_core:,.0f} {what[kind]} per core-second (HAProxy nbthread 1, 64 at once)")
            add(f"{name}_requests_per_core_second_{kind}", per_core, "requests/s", better="higher")
        per_chunk = (cpu_a_request["long"] - cpu_a_request["stream"]) / (LONG_TOKENS - TOKENS)
        print(f"{name}: {per_chunk:.2f} µs of HAProxy CPU a streamed chunk")
        add(f"{name}_cpu_per_streamed_chunk", per_chunk, "µs")
    for max_body, relay in MEMORY:
        idle, held, opened = results[memory_key(max_body, relay)]
        bufsize = Frontend("", max_body, relay=relay).bufsize
        suffix = "" if relay else "_norelay"
        print(
            f"gateway{'' if relay else ' without the relay'}, --max-body {max_body} (tune.bufsize {bufsize}): "
            f"RSS {idle / 2**20:.1f} MiB idle, {held / 2**20:.1f} MiB with "
            f"{opened} streams open ({(held - idle) / max(opened, 1) / 1024:.1f} KiB a stream)"
        )
        add(f"gateway_rss_idle_max_body_{max_body}{suffix}", idle / 2**20, "MiB")
        add(f"gateway_rss_{args.streams}_streams_max_body_{max_body}{suffix}", held / 2**20, "MiB")
        add(f"gateway_streams_opened_max_body_{max_body}{suffix}", opened, "streams", args.streams, "higher")
        if opened < args.streams:
            missed.append(f"only {opened} of {args.streams} streams opened (--max-body {max_body}{suffix})")
    if "litellm_rss" in results:
        print(f"LiteLLM's proxy: RSS {results['litellm_rss'] / 2**20:.0f} MiB after its runs")
        add("litellm_rss", results["litellm_rss"] / 2**20, "MiB")
    for line in missed:
        print(f"missed: {line}")
    return rows


def report_wrk(results: dict, args, add: Callable, missed: list[str]) -> None:
    """wrk's phases: each path's median over the rounds, and the median of each round's difference to direct."""
    before, after = results["load_before_wrk"], results["load_after_wrk"]
    print(
        f"\nwrk (one C thread) against the fixed engine (HAProxy answering from memory), {args.rounds} rounds of "
        f"{args.wrk_seconds} s a path (LiteLLM: one run of {args.litellm_seconds} s, in the first round), "
        "medians over the rounds; "
        f"load average {before[0]:.1f} before, {after[0]:.1f} after"
    )
    print(
        "\n| phase | path | requests | errors | requests/s | p50 | p99 | added p50 | added p99 "
        "| CPU a request (the proxy's; direct: the engine's) | its wait for a CPU a request |"
    )
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for phase, by_route in results["wrk"].items():
        direct = by_route["direct"]
        slug = phase.replace(" ", "_")
        added: dict[str, float] = {}
        for name, runs in by_route.items():
            requests, errors = sum(r["requests"] for r in runs), sum(r["errors"] for r in runs)
            p50, p99 = (statistics.median(r[q] for r in runs) for q in ("p50", "p99"))
            rate = statistics.median(r["rate"] for r in runs)
            add(f"{name}_{slug}_p50", p50, "µs")
            add(f"{name}_{slug}_p99", p99, "µs")
            add(f"{name}_{slug}_requests_per_second", rate, "requests/s", better="higher")
            add(f"{name}_{slug}_errors", errors, "requests", 0)
            if errors:
                missed.append(f"{errors} errors through {name} ({phase})")
            shown = f"| {phase} | {name} | {requests} | {errors} | {rate:,.0f} | {p50:,.0f} µs | {p99:,.0f} µs |"
            if not requests:
                print(f"{shown} none answered within its run | | | |")
                missed.append(f"no request through {name} was answered within its run ({phase})")
                continue
            # Direct: the fixed engine's own; else the proxy's (the engine's is the same on every path).
            cpu = sum(r["cpu_ns"] for r in runs) / 1000 / requests
            wait = sum(r["wait_ns"] for r in runs) / 1000 / requests
            add(f"{name}_{slug}_cpu_per_request", cpu, "µs")
            add(f"{name}_{slug}_cpu_wait_per_request", wait, "µs")
            if name == "direct":
                print(f"{shown} | | {cpu:,.1f} µs | {wait:,.1f} µs |")
                continue
            # Each round's difference to the direct run just before it, then their median (LiteLLM: its one round).
            pairs = list(zip(runs, direct, strict=False))
            added[name] = added50 = statistics.median(r["p50"] - d["p50"] for r, d in pairs)
            added99 = statistics.median(r["p99"] - d["p99"] for r, d in pairs)
            print(f"{shown} {added50:+,.0f} µs | {added99:+,.0f} µs | {cpu:,.1f} µs | {wait:,.1f} µs |")
            add(f"{name}_{slug}_added_p50", added50, "µs", 200 if name == "gateway" else None)
            add(f"{name}_{slug}_added_p99", added99, "µs")
            if name == "gateway" and added50 > 200:
                missed.append(f"the gateway's added p50 ({phase}) is {added50:.0f} µs (target ≤ 200)")
        if "litellm" in added and "gateway" in added:
            if added["gateway"] > 0:
                ratio = added["litellm"] / added["gateway"]
                add(f"litellm_to_gateway_added_p50_{slug}", ratio, "ratio", 50, "higher")
                print(f"| {phase} | LiteLLM's added p50 ÷ the gateway's | {ratio:,.0f} (target ≥ 50) |")
                if ratio < 50:
                    missed.append(f"LiteLLM's added p50 ({phase}) is {ratio:.0f}× the gateway's (target ≥ 50)")
            else:
                print(f"| {phase} | LiteLLM's added p50 ÷ the gateway's | none: the gateway's is ≤ 0 |")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5, help="turns of the routes (default 5)")
    parser.add_argument("--requests", type=int, default=1500, help="per route at 1 stream, twice at 64 (default 1500)")
    parser.add_argument("--litellm-requests", type=int, default=300, help="LiteLLM's, per phase (default 300)")
    parser.add_argument("--ttft-requests", type=int, default=40, help="paced streams per path (default 40)")
    parser.add_argument("--streams", type=int, default=1000, help="held open for the memory figure (default 1000)")
    parser.add_argument("--no-litellm", action="store_true", help="leave LiteLLM out (no install, no comparison)")
    parser.add_argument("--wrk-seconds", type=int, default=2, help="each wrk run, a path a round (default 2)")
    parser.add_argument(
        "--litellm-seconds", type=int, default=8, help="LiteLLM's one wrk run a phase, in the first round (default 8)"
    )
    parser.add_argument("--no-wrk", action="store_true", help="leave out wrk's phases (1 and 64 connections)")
    parser.add_argument("--quick", action="store_true", help="a few requests, no LiteLLM, to see it run")
    args = parser.parse_args(argv)
    if args.quick:
        args.rounds, args.requests, args.ttft_requests, args.streams, args.no_litellm = 2, 128, 3, 50, True
        args.wrk_seconds = 1
    args.wrk = not args.no_wrk and wrk.available()
    if not args.no_wrk and not args.wrk:
        print("wrk is not installed (scripts/system-packages --with-browser installs it): its phases are left out")
    args.counts_1 = {**dict.fromkeys(("direct", *GATEWAYS), args.requests), "litellm": args.litellm_requests}
    args.counts_64 = {**dict.fromkeys(("direct", *GATEWAYS), args.requests * 2), "litellm": args.litellm_requests}
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
    # A request that failed means the setup is broken: no figure stands.
    return 1 if any(row["name"].endswith("_errors") and row["value"] for row in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
