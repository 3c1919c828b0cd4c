"""The usage filter under load, for a while: no crash, no growth, usage still exact.

The gateway as shipped (deploy/gateway.cfg with its Lua usage filter, one thread) in front of
two demo engines; `--clients` threads send streams (asking for no usage: the relay asks for a
running usage on every event, as for a demo deployment) and whole answers of random sizes for
`--seconds`, some clients closing streams mid-way. Every few seconds the totals are
taken from HAProxy (`llmgw usage take`) as the sync takes them. At the end: the worker still the
same process, its resident memory at the start and end of the load, and the tokens counted
against the engine's own counters. Streams their client cuts go to a
second engine, reported apart: each is counted, its prompt exactly and its completion up to
what the engine made before it saw the client gone.

    python -m bench.tenants_soak [--seconds 180] [--clients 16]
"""

from __future__ import annotations

import argparse
import functools
import http.client
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

from bench.agent_cost import write_results
from bench.tenants import KEY, SECRET, gateway, start, worker_pid
from devstack.polling import wait_until
from devstack.ports import free_port, port_open
from gateway.runtime import Runtime

# Usage reading without Django: the same parsing as gateway.usage.take.


def take(runtime: Runtime, totals: dict[str, list[int]]) -> None:
    """Add what HAProxy counted, per served model, to `totals`."""
    for line in runtime.ask("llmgw usage take").splitlines():
        fields = line.split()
        if len(fields) == 6:
            total = totals.setdefault(fields[1], [0, 0, 0])
            for i in range(3):
                total[i] += int(fields[3 + i])


def engine_counter(port: int, name: str) -> float:
    request = urllib.request.Request(f"http://127.0.0.1:{port}/metrics", headers={"Authorization": f"Bearer {SECRET}"})
    text = urllib.request.urlopen(request, timeout=5).read().decode()
    return float(next(line.split()[-1] for line in text.splitlines() if line.startswith(name + "{")))


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


class Client(threading.Thread):
    def __init__(self, port: int, until: float, seed: int):
        super().__init__(daemon=True)
        self.port, self.until, self.random = port, until, random.Random(seed)
        self.sent = self.cut = self.failed = 0

    def run(self) -> None:
        while time.monotonic() < self.until:
            tokens = self.random.randint(1, 64)
            stream = self.random.random() < 0.5
            # Streams a client cuts go to their own engine ("cut"): their completion is counted only as
            # far as the gateway saw, and the other engine's counters must equal what was counted, exactly.
            cutting = stream and self.random.random() < 0.05
            body: dict[str, object] = {
                "model": "cut" if cutting else "whole",
                "prompt": "w " * self.random.randint(1, 50),
            }
            body["max_tokens"] = tokens
            if stream:
                body["stream"] = True
            try:
                connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
                connection.request("POST", "/v1/completions", json.dumps(body), {"Authorization": f"Bearer {KEY}"})
                answer = connection.getresponse()
                if cutting:
                    answer.read(64)  # a client gone mid-stream
                    self.cut += 1
                else:
                    answer.read()
                    self.sent += 1
                connection.close()
                if answer.status != 200:
                    self.failed += 1
            except OSError:
                self.failed += 1


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.tenants_soak", description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=180)
    parser.add_argument("--clients", type=int, default=16)
    args = parser.parse_args(argv)
    processes: list[subprocess.Popen] = []
    with tempfile.TemporaryDirectory() as tmp:
        try:
            engines = {"whole": free_port(), "cut": free_port()}
            for engine_port in engines.values():
                processes.append(
                    start(
                        [
                            *(sys.executable, "-m", "agent.demo_engine", "--port", str(engine_port)),
                            *("--cpu-ms-per-token", "0.05", "--kib-per-token", "1", "--max-running", "64"),
                        ],
                        env={"LLMGW_ENGINE_API_KEY": SECRET},
                    )
                )
                wait_until(functools.partial(port_open, engine_port), 10, "the demo engine")
            process, port = gateway(Path(tmp) / "on", engines, "on")
            processes.append(process)
            pid = worker_pid(process)
            runtime = Runtime(Path(tmp) / "on" / "admin.sock")
            until = time.monotonic() + args.seconds
            clients = [Client(port, until, seed) for seed in range(args.clients)]
            for client in clients:
                client.start()
            time.sleep(min(10, args.seconds / 4))
            rss_start = rss_kib(pid)
            counted: dict[str, list[int]] = {}
            # The worker's memory each minute: a leak shows as a rise that keeps going, not as one step.
            rss_samples = [rss_start]
            next_sample = time.monotonic() + 60
            while any(client.is_alive() for client in clients):
                time.sleep(2)
                take(runtime, counted)
                if time.monotonic() >= next_sample:
                    rss_samples.append(rss_kib(pid))
                    next_sample += 60
                    print(f"minute {len(rss_samples) - 1}: worker RSS {rss_samples[-1]} KiB", flush=True)
            for client in clients:
                client.join()
            time.sleep(1)
            take(runtime, counted)
            rss_end = rss_kib(pid)
            same_worker = worker_pid(process) == pid and process.poll() is None
            engine_prompt = engine_counter(engines["whole"], "vllm:prompt_tokens_total")
            engine_completion = engine_counter(engines["whole"], "vllm:generation_tokens_total")
            cut_prompt = engine_counter(engines["cut"], "vllm:prompt_tokens_total")
            cut_completion = engine_counter(engines["cut"], "vllm:generation_tokens_total")
        finally:
            for each in processes:
                os.killpg(each.pid, signal.SIGKILL)
                each.wait()
    whole = counted.get("whole", [0, 0, 0])
    cut_counted = counted.get("cut", [0, 0, 0])
    sent = sum(c.sent for c in clients)
    cut = sum(c.cut for c in clients)
    failed = sum(c.failed for c in clients)
    rows = [
        {"name": "seconds", "value": args.seconds, "unit": "s", "target": None, "better": "higher"},
        {"name": "clients", "value": args.clients, "unit": "", "target": None, "better": "higher"},
        {"name": "answers_read_whole", "value": sent, "unit": "", "target": None, "better": "higher"},
        {"name": "streams_cut_by_client", "value": cut, "unit": "", "target": None, "better": "lower"},
        {"name": "failed", "value": failed, "unit": "", "target": 0, "better": "lower"},
        {"name": "worker_survived", "value": int(same_worker), "unit": "", "target": 1, "better": "higher"},
        {"name": "rss_start_kib", "value": rss_start, "unit": "KiB", "target": None, "better": "lower"},
        {"name": "rss_end_kib", "value": rss_end, "unit": "KiB", "target": None, "better": "lower"},
        {
            "name": "rss_max_kib",
            "value": max([*rss_samples, rss_end]),
            "unit": "KiB",
            "target": None,
            "better": "lower",
        },
        {
            "name": "rss_second_half_growth_kib",
            "value": rss_end - rss_samples[len(rss_samples) // 2],
            "unit": "KiB",
            "target": None,
            "better": "lower",
        },
        {"name": "requests_counted", "value": whole[0], "unit": "", "target": sent, "better": "higher"},
        {"name": "prompt_tokens_counted", "value": whole[1], "unit": "", "target": engine_prompt, "better": "higher"},
        {"name": "prompt_tokens_engine", "value": engine_prompt, "unit": "", "target": None, "better": "higher"},
        {
            "name": "completion_tokens_counted",
            "value": whole[2],
            "unit": "",
            "target": engine_completion,
            "better": "higher",
        },
        {
            "name": "completion_tokens_engine",
            "value": engine_completion,
            "unit": "",
            "target": None,
            "better": "higher",
        },
        {"name": "cut_streams_counted", "value": cut_counted[0], "unit": "", "target": cut, "better": "higher"},
        {
            "name": "cut_prompt_tokens_counted",
            "value": cut_counted[1],
            "unit": "",
            "target": cut_prompt,
            "better": "higher",
        },
        {
            "name": "cut_completion_tokens_counted",
            "value": cut_counted[2],
            "unit": "",
            "target": None,
            "better": "higher",
        },
        {
            "name": "cut_completion_tokens_engine",
            "value": cut_completion,
            "unit": "",
            "target": None,
            "better": "higher",
        },
    ]
    write_results("tenants_soak", rows)


if __name__ == "__main__":
    main()
