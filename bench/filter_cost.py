"""What counting tokens costs HAProxy, in instructions: counted by valgrind's callgrind, so the
machine's load does not move them (bench.tenants' latencies and CPU times do, by ±100 µs here).

The same sides as bench.tenants ("off", "limits", "on" as shipped, "before" with `--lua-before FILE`),
each an HAProxy run under callgrind in turn, in front of the same stand-in engines: instructions per
whole answer (an engine that costs nothing) and per stream of `--chunks` chunks (the demo engine,
its streams asked by the relay for the usage so far on every event, as a demo deployment's are),
counted between a warm-up and the end (`callgrind_control` zeroes, then dumps). Differences between
sides are the cost of what one adds; instructions are not time (callgrind counts a `rep movsb` copy
as one per byte, and knows no cache misses), but they are exact and the same from run to run.

With `--straight`, a side "straight" is "on" with its streams sent straight to their backend instead of
through the stream relay (deploy/gateway_relay.lua), which then neither asks them for a running usage nor
counts them itself (the filter does): what the relay costs a stream, in instructions.

With `--l4-retries-only`, every side retries on connection failures alone (`retry-on
conn-failure`), without the L7 retries the gateway ships (`empty-response 503`): for those HAProxy
2.6 copies a whole buffer (`tune.bufsize`, 272 KiB by default) into a reserve on each request,
whatever its size, and this shows what that copy is of each side's count.

    python -m bench.filter_cost [--requests 500] [--streams 40] [--chunks 50] [--lua-before FILE] [--straight]
                                [--l4-retries-only]
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

from bench import tenants
from bench.agent_cost import write_results
from devstack import gateway as devgateway
from devstack.polling import wait_until
from devstack.ports import free_port, port_open
from gateway.haproxy_config import Paths

# `--straight`'s side: the shipped config, streams not relayed.
STRAIGHT = "straight"
# The gateway's retries (deploy/gateway.cfg); `--l4-retries-only` keeps the first of them alone.
L7_RETRIES = "retry-on conn-failure empty-response 503"


def streams(port: int, count: int, chunks: int) -> None:
    for _ in range(count):
        tenants.one_stream(port, chunks)


def instructions(directory: Path, port: int, work, warm) -> int:
    """Instructions HAProxy ran for `work()`, after `warm()`."""
    out = directory / "callgrind.out"
    command = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}"]
    command += [devgateway.haproxy_binary(), "-db", "-f", str(Paths(directory).config)]
    process = tenants.start(command, env=devgateway.HAPROXY_ENV)
    try:
        wait_until(lambda: port_open(port), 120, "the gateway under callgrind")
        warm()
        subprocess.run(["callgrind_control", "--zero", str(process.pid)], check=True, capture_output=True)
        work()
        subprocess.run(["callgrind_control", "--dump", str(process.pid)], check=True, capture_output=True)
        dump = max(directory.glob("callgrind.out.*"), key=lambda p: p.stat().st_mtime)
        totals = [line for line in dump.read_text().splitlines() if line.startswith(("summary:", "totals:"))]
        return int(totals[-1].split()[1])
    finally:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.filter_cost", description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=500, help="whole answers per side")
    parser.add_argument("--streams", type=int, default=40, help="streams per side")
    parser.add_argument("--chunks", type=int, default=50, help="chunks of each stream")
    parser.add_argument("--lua-before", type=Path, help="another usage filter to count as side 'before'")
    parser.add_argument("--straight", action="store_true", help="a side 'straight': 'on' without the stream relay")
    parser.add_argument("--l4-retries-only", action="store_true", help="every side without L7 retries")
    args = parser.parse_args(argv)
    if not shutil.which("valgrind") or not shutil.which("callgrind_control"):
        sys.exit("valgrind is missing: apt-get install valgrind")
    sides = (*tenants.SIDES, *(("before",) if args.lua_before else ()), *((STRAIGHT,) if args.straight else ()))
    per_request: dict[str, float] = {}
    per_stream: dict[str, float] = {}
    processes: list[subprocess.Popen] = []
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp)
        try:
            engine, fixed_port = tenants.fixed_engine(directory)
            processes.append(engine)
            stream_port = free_port()
            demo = tenants.start(
                [
                    *(sys.executable, "-m", "agent.demo_engine", "--port", str(stream_port)),
                    *("--cpu-ms-per-token", "0", "--kib-per-token", "1", "--max-running", "64"),
                ],
                env={"LLMGW_ENGINE_API_KEY": tenants.SECRET},
            )
            processes.append(demo)
            wait_until(lambda: port_open(stream_port), 10, "the demo engine")
            engines = {"fixed": fixed_port, "stream": stream_port}
            for side in sides:
                here = directory / side
                if side == STRAIGHT:
                    port = tenants.configure(here, engines, "on", relay=False)
                else:
                    port = tenants.configure(here, engines, side, args.lua_before)
                if args.l4_retries_only:
                    config = Paths(here).config
                    shipped = config.read_text()
                    assert L7_RETRIES in shipped, f"no `{L7_RETRIES}` in the gateway's config"
                    config.write_text(shipped.replace(L7_RETRIES, "retry-on conn-failure"))
                whole = instructions(
                    here,
                    port,
                    lambda p=port: tenants.whole_answers(p, args.requests),
                    lambda p=port: tenants.whole_answers(p, 100),
                )
                per_request[side] = whole / args.requests
                streamed = instructions(
                    here,
                    port,
                    lambda p=port: streams(p, args.streams, args.chunks),
                    lambda p=port: streams(p, 5, args.chunks),
                )
                per_stream[side] = streamed / args.streams
                print(f"{side}: {per_request[side]:,.0f} per request, {per_stream[side]:,.0f} per stream", flush=True)
        finally:
            for process in processes:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
    rows = []
    for side in sides:
        rows += [
            {
                "name": f"instructions_per_request_{side}",
                "value": round(per_request[side]),
                "unit": "",
                "target": None,
                "better": "lower",
            },
            {
                "name": f"instructions_per_stream_{side}",
                "value": round(per_stream[side]),
                "unit": "",
                "target": None,
                "better": "lower",
            },
        ]
    for side in sides:
        if side != "off":
            rows.append(
                {
                    "name": f"instructions_added_per_request_by_{side}",
                    "value": round(per_request[side] - per_request["off"]),
                    "unit": "",
                    "target": None,
                    "better": "lower",
                }
            )
            rows.append(
                {
                    "name": f"instructions_added_per_stream_by_{side}",
                    "value": round(per_stream[side] - per_stream["off"]),
                    "unit": "",
                    "target": None,
                    "better": "lower",
                }
            )
    rows.append({"name": "chunks_per_stream", "value": args.chunks, "unit": "", "target": None, "better": "higher"})
    write_results("filter_cost-l4-retries-only" if args.l4_retries_only else "filter_cost", rows)


if __name__ == "__main__":
    main()
