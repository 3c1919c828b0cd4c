"""What tenants' limits and usage counting add to the gateway: latency and HAProxy CPU, on against off.

The same gateway config (deploy/gateway.cfg as the sync renders it) twice: "on" as shipped,
its tenant with a requests-per-second and a concurrency limit too high to refuse anything, the
Lua usage filter reading every answer; "off" the same with the limit, budget and usage lines
taken out. Both in front of the same stand-in engines, alternating rounds so the machine's
load falls on both alike:

(a) whole answers from an engine that costs nothing (an HAProxy answering a fixed chat
    completion with its `usage`): p50 and p99 latency over one kept-alive connection, and
    the gateway's CPU per request (schedstat);
(b) streams from the demo engine (CPU per token 0): the gateway's CPU per streamed chunk.

With `--lua-before FILE` (an earlier deploy/gateway_usage.lua, e.g. from `git show`), a fourth
side "before" is "on" with that file loaded instead, alternated with the others in the same run:
a change to the filter measured against what it replaces, on the same load.

    python -m bench.tenants [--requests 3000] [--rounds 5] [--chunks 500] [--lua-before FILE]
"""

from __future__ import annotations

import argparse
import hashlib
import http.client
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from agent import enginekinds
from bench.agent_cost import cpu_ns, write_results
from devstack import gateway as devgateway
from devstack.polling import wait_until
from devstack.ports import free_port, port_open
from gateway import haproxy_config
from gateway.haproxy_config import Backend, Desired, Frontend, Paths, Server

ROOT = Path(__file__).resolve().parent.parent
KEY = "llmgw-sk-bench"
SECRET = "engine-secret"
ANSWER = json.dumps(
    {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "Paris."}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7},
    },
    separators=(",", ":"),
)
# What each side removes from the config as shipped: "off" every line of the limits, the budgets
# and the usage filter; "limits" the usage filter only (to tell the two costs apart).
REMOVED = {
    "on": (),
    "limits": ("gateway_usage.lua", "filter lua."),
    "off": ("gateway_usage.lua", "filter lua.", "track-sc0", "rps_limit", "concurrency_limit", "budget", "sc-inc-gpc0"),
}
SIDES = tuple(REMOVED)


def start(command: list[str], env: dict | None = None) -> subprocess.Popen:
    return subprocess.Popen(
        command,
        env={**os.environ, **(env or {})},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )


def fixed_engine(directory: Path) -> tuple[subprocess.Popen, int]:
    port = free_port()
    config = directory / "engine.cfg"
    config.write_text(
        "global\n    nbthread 1\ndefaults\n    mode http\n    timeout client 30s\n    timeout server 30s\n"
        f"    timeout connect 2s\nfrontend engine\n    bind 127.0.0.1:{port}\n"
        f"    http-request return status 200 content-type application/json string '{ANSWER}'\n"
    )
    process = start([devgateway.haproxy_binary(), "-db", "-f", str(config)])
    wait_until(lambda: port_open(port), 10, "the fixed engine")
    return process, port


# What the sync gives a demo deployment's backend: the members the relay adds to its streams.
RUNNING_USAGE = enginekinds.get("demo").running_usage


def configure(
    directory: Path, engines: dict[str, int], side: str, lua_before: Path | None = None, relay: bool = True
) -> int:
    """The shipped config for one side, written into `directory`; the port it will listen on.

    `relay` False: streams go straight to their backend, not through the stream relay (what it costs).
    """
    port = free_port()
    paths = Paths(directory)
    backends = {
        served: Backend(served, SECRET, (Server(f"{served}-r1", "127.0.0.1", engine),), running_usage=RUNNING_USAGE)
        for served, engine in engines.items()
    }
    desired = Desired(
        backends=backends,
        keys={hashlib.sha256(KEY.encode()).hexdigest(): "bench"},
        requests_per_second={"bench": "1000000"},
        concurrent_requests={"bench": "1000"},
    )
    haproxy_config.write_all(paths, Frontend(f"127.0.0.1:{port}", relay=relay), desired)
    text = paths.config.read_text()
    if side == "before" and lua_before is not None:
        text = text.replace(str(haproxy_config.USAGE_LUA), str(lua_before.resolve()))
    lines = text.splitlines()
    removed = REMOVED.get(side, ())
    paths.config.write_text("\n".join(line for line in lines if not any(w in line for w in removed)) + "\n")
    return port


def gateway(
    directory: Path, engines: dict[str, int], side: str, lua_before: Path | None = None
) -> tuple[subprocess.Popen, int]:
    port = configure(directory, engines, side, lua_before)
    process = start(devgateway.haproxy_command(directory), env=devgateway.HAPROXY_ENV)
    wait_until(lambda: port_open(port), 10, "the gateway")
    return process, port


def worker_pid(master: subprocess.Popen) -> int:
    children = Path(f"/proc/{master.pid}/task/{master.pid}/children").read_text().split()
    return int(children[0])


def whole_answers(port: int, count: int) -> list[float]:
    body = json.dumps({"model": "fixed", "messages": [{"role": "user", "content": "Capital of France?"}]})
    headers = {"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"}
    connection = http.client.HTTPConnection("127.0.0.1", port)
    took = []
    for _ in range(count):
        started = time.perf_counter()
        connection.request("POST", "/v1/chat/completions", body, headers)
        answer = connection.getresponse()
        answer.read()
        took.append(time.perf_counter() - started)
        assert answer.status == 200, answer.status
    connection.close()
    return took


def one_stream(port: int, chunks: int) -> None:
    """A stream whose client asks for no usage: the relay asks for the running usage, as for a demo deployment."""
    body = json.dumps({"model": "stream", "prompt": "x", "max_tokens": chunks, "stream": True})
    connection = http.client.HTTPConnection("127.0.0.1", port)
    connection.request("POST", "/v1/completions", body, {"Authorization": f"Bearer {KEY}"})
    answer = connection.getresponse()
    assert answer.status == 200 and answer.read().endswith(b"data: [DONE]\n\n")
    connection.close()


def percentile(values: list[float], q: float) -> float:
    return sorted(values)[min(len(values) - 1, int(q * len(values)))]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.tenants", description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=3000, help="whole answers per round and side")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--chunks", type=int, default=500, help="chunks of each stream")
    parser.add_argument("--streams", type=int, default=10, help="streams per round and side")
    parser.add_argument("--lua-before", type=Path, help="another usage filter to measure as side 'before'")
    args = parser.parse_args(argv)
    sides_run = (*SIDES, "before") if args.lua_before else SIDES
    processes: list[subprocess.Popen] = []
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp)
        try:
            engine, fixed_port = fixed_engine(directory)
            processes.append(engine)
            stream_port = free_port()
            demo = start(
                [
                    *(sys.executable, "-m", "agent.demo_engine", "--port", str(stream_port)),
                    *("--cpu-ms-per-token", "0", "--kib-per-token", "1", "--max-running", "64"),
                ],
                env={"LLMGW_ENGINE_API_KEY": SECRET},
            )
            processes.append(demo)
            wait_until(lambda: port_open(stream_port), 10, "the demo engine")
            engines = {"fixed": fixed_port, "stream": stream_port}
            sides = {}
            for side in sides_run:
                process, port = gateway(directory / side, engines, side, args.lua_before)
                processes.append(process)
                sides[side] = (port, worker_pid(process))
            figures: list[dict[str, list[float]]] = [{side: [] for side in sides_run} for _ in range(4)]
            p50, p99, cpu_request, cpu_chunk = figures
            for side in sides:  # warm both: connections to the engines, Lua, the tables
                whole_answers(sides[side][0], 200)
                one_stream(sides[side][0], 10)
            for round_ in range(args.rounds):
                for side in sides_run if round_ % 2 == 0 else sides_run[::-1]:
                    port, pid = sides[side]
                    before = cpu_ns(pid)
                    took = whole_answers(port, args.requests)
                    cpu_request[side].append((cpu_ns(pid) - before) / args.requests / 1000)
                    p50[side].append(statistics.median(took) * 1e6)
                    p99[side].append(percentile(took, 0.99) * 1e6)
                    before = cpu_ns(pid)
                    for _ in range(args.streams):
                        one_stream(port, args.chunks)
                    cpu_chunk[side].append((cpu_ns(pid) - before) / (args.streams * args.chunks) / 1000)
        finally:
            for process in processes:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()

    def median(values: list[float]) -> float:
        return round(statistics.median(values), 1)

    rows = []
    for side in sides_run:
        rows += [
            {"name": f"p50_{side}_us", "value": median(p50[side]), "unit": "µs", "target": None, "better": "lower"},
            {"name": f"p99_{side}_us", "value": median(p99[side]), "unit": "µs", "target": None, "better": "lower"},
            {
                "name": f"cpu_per_request_{side}_us",
                "value": median(cpu_request[side]),
                "unit": "µs",
                "target": None,
                "better": "lower",
            },
            {
                "name": f"cpu_per_chunk_{side}_us",
                "value": median(cpu_chunk[side]),
                "unit": "µs",
                "target": None,
                "better": "lower",
            },
        ]
    rows += [
        {
            "name": f"p50_added_by_{side}_us",
            "value": round(median(p50[side]) - median(p50["off"]), 1),
            "unit": "µs",
            "target": 50 if side == "on" else None,
            "better": "lower",
        }
        for side in ("on", "limits", *(("before",) if args.lua_before else ()))
    ]
    rows.append({"name": "rounds", "value": args.rounds, "unit": "", "target": None, "better": "higher"})
    write_results("tenants", rows)


if __name__ == "__main__":
    main()
