"""A real engine under the agent: llama-server serving SmolLM2-135M-Instruct to a steady stream of requests.

A real agent (`python -m agent`, its own process) is told by a stand-in control plane in
this process to install llama.cpp and run one shard of it; a client thread asks one
question after another. Over the same heartbeats this measures:

(a) the cores and resident memory the agent reports for the shard, against psutil's
    reading of the same processes over the same window (targets: within 5 % and 1 %);
(b) the agent's own CPU per sample-and-beat cycle with that busy engine, beside
    `bench/agent_cost.py`'s figure (bench/results/agent_cost.json) for idle groups;
(c) the model's tokens per second on this machine, for reference;
(d) provisioning: a warm install (from the shared cache) timed here; the cold build
    only with --cold (20-35 minutes on two busy cores; docs/engines.md has the figure).

    python -m bench.engine [--cold]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from functools import partial
from pathlib import Path

import psutil

from agent import enginekinds, protocol
from agent.enginekinds import Launch
from agent.model_fetch import SMOLLM2_135M_INSTRUCT, fetch
from agent.provision import Provisioner, Want
from bench.agent_cost import cpu_ns, write_results
from devstack.fakecp import FakeControlPlane
from devstack.polling import wait_until
from devstack.ports import free_port

ROOT = Path(__file__).resolve().parent.parent
VERSION = enginekinds.get("llama.cpp").pinned
SHARD = "smollm2-0"
WARMUP_BEATS = 3
WINDOW_BEATS = 30
COLD_TIMEOUT = 60 * 60


def install_seconds(cache: Path | None) -> float:
    """Time for the agent's installer to make llama.cpp ready in a fresh home (from `cache`, or the shared one)."""
    with tempfile.TemporaryDirectory(prefix="engine-bench-") as home:
        provisioner = Provisioner(Path(home), cache=cache)
        started = time.monotonic()
        provisioner.want([Want("llama.cpp", VERSION, "cpu")])
        wait_until(lambda: provisioner.entries()[0].state != "installing", COLD_TIMEOUT, "llama.cpp to install")
        took = time.monotonic() - started
        (entry,) = provisioner.entries()
        provisioner.stop()
        if entry.state != "ready":
            sys.exit(f"llama.cpp install {entry.state}: {entry.detail}")
        return took


def chat(port: int, question: str, max_tokens: int) -> dict:
    body = json.dumps({"messages": [{"role": "user", "content": question}], "max_tokens": max_tokens}).encode()
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/v1/chat/completions", body, {"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=600) as response:
        return json.load(response)


def healthy(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as response:
            return b"ok" in response.read()
    except OSError:
        return False


class Stream:
    """One client asking again as soon as it has its answer: the engine never idles."""

    def __init__(self, port: int):
        self.port = port
        self.tokens = 0
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self.stopping.is_set():
            self.tokens += chat(self.port, "Tell me about the sea.", 32)["usage"]["completion_tokens"]

    def __enter__(self) -> Stream:
        self.started = time.monotonic()
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stopping.set()
        self.thread.join(600)
        self.seconds = time.monotonic() - self.started


def group_cpu_and_rss(pid: int) -> tuple[float, int]:
    """CPU seconds (user + system, all threads) and resident bytes of the process and its descendants."""
    root = psutil.Process(pid)
    cpu, rss = 0.0, 0
    for process in (root, *root.children(recursive=True)):
        try:
            times = process.cpu_times()
            cpu += times.user + times.system
            rss += process.memory_info().rss
        except psutil.NoSuchProcess:
            continue
    return cpu, rss


def shard_load(beat: protocol.Heartbeat) -> tuple[float, int, float] | None:
    """(cores, resident bytes, interval) the agent reported for the shard in one heartbeat."""
    if beat.load is None:
        return None
    for shard in beat.load.shards:
        if shard.shard == SHARD:
            return shard.cpu_cores, shard.rss_bytes, beat.load.interval_seconds
    return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cold", action="store_true", help="also time a cold build in an empty cache (long)")
    args = parser.parse_args()

    # The shared cache is filled first if need be (a cold build), so the warm figure is a warm one.
    first = install_seconds(None)
    warm = install_seconds(None)
    cold = None
    if args.cold:
        with tempfile.TemporaryDirectory(prefix="engine-bench-cache-") as cache:
            cold = install_seconds(Path(cache))

    var = Path(tempfile.mkdtemp(prefix="engine-bench-"))
    model = fetch(SMOLLM2_135M_INSTRUCT, var / "models")
    port = free_port()
    command = enginekinds.command_line("llama.cpp", Launch(str(model), port, host="127.0.0.1", threads=2))
    (var / "join").write_text("join-secret")
    with FakeControlPlane(interval=1.0) as plane:
        plane.engines = [protocol.EngineWant(engine="llama.cpp", version=VERSION, variant="cpu")]
        plane.shards = [
            protocol.ShardSpec(
                shard=SHARD, replica="smollm2", model=str(model), engine="llama.cpp", command=command, port=port
            )
        ]
        config = var / "agent.yaml"
        config.write_text(
            f"control_plane: {plane.url}\njoin_token_file: {var / 'join'}\nstate_dir: {var / 'state'}\n"
            f"interval: 1\nengines: {{}}\nmodel_dirs: [{var / 'models'}]\n"
        )
        agent = subprocess.Popen(
            [sys.executable, "-m", "agent", "--config", str(config), "--log-level", "WARNING"], cwd=ROOT
        )
        try:
            wait_until(lambda: healthy(port), 600, "llama-server to load the model")
            pid = next(s.pid for s in list(plane.heartbeats)[-1].shards if s.shard == SHARD)
            with Stream(port) as stream:
                wait_until(lambda: stream.tokens > 0, 300, "a first answer")
                for _ in range(WARMUP_BEATS):
                    seen = plane.accepted()
                    wait_until(partial(plane.accepted_more_than, seen), 10, "a heartbeat", interval=0.002)
                rows = []  # (reported cores, reported rss, interval, psutil cpu s, psutil rss, agent cpu ns)
                for _ in range(WINDOW_BEATS + 1):
                    seen = plane.accepted()
                    wait_until(partial(plane.accepted_more_than, seen), 10, "a heartbeat", interval=0.002)
                    # The heartbeat just arrived: the agent's window ended a moment ago; read ours now.
                    cpu, rss = group_cpu_and_rss(pid)
                    reported = shard_load(list(plane.heartbeats)[-1])
                    if reported is None:
                        sys.exit("a heartbeat without the shard's load")
                    rows.append((*reported, cpu, rss, cpu_ns(agent.pid)))
        finally:
            agent.terminate()
            agent.wait(30)

    # Heartbeat 0 opens the window; each later one reports the interval that ended with it.
    agent_cpu = sum(cores * interval for cores, _, interval, *_ in rows[1:])
    psutil_cpu = rows[-1][3] - rows[0][3]
    rss_errors = [abs(reported - measured) / measured for _, reported, _, _, measured, _ in rows]
    agent_ms = (rows[-1][5] - rows[0][5]) / 1e6 / WINDOW_BEATS
    idle = _idle_agent_figure()
    span = sum(interval for _, _, interval, *_ in rows[1:])
    print(f"window: {WINDOW_BEATS} heartbeats, {span:.1f} s; engine pid {pid}")
    print(f"cores: agent {agent_cpu / span:.3f}, psutil {psutil_cpu / span:.3f}")
    results = [
        {
            "name": "shard_cores_error_percent",
            "value": round(100 * abs(agent_cpu - psutil_cpu) / psutil_cpu, 3),
            "unit": "%",
            "target": 5,
            "better": "lower",
        },
        {
            "name": "shard_rss_error_percent_median",
            "value": round(100 * statistics.median(rss_errors), 3),
            "unit": "%",
            "target": 1,
            "better": "lower",
        },
        {
            "name": "shard_cores_psutil",
            "value": round(psutil_cpu / span, 3),
            "unit": "cores",
            "target": None,
            "better": "higher",
        },
        {
            "name": "agent_cycle_cpu_ms_busy_engine",
            "value": round(agent_ms, 2),
            "unit": "ms",
            "target": idle,
            "better": "lower",
        },
        {
            "name": "tokens_per_second",
            "value": round(stream.tokens / stream.seconds, 2),
            "unit": "tokens/s",
            "target": None,
            "better": "higher",
        },
        {"name": "install_first_seconds", "value": round(first, 2), "unit": "s", "target": None, "better": "lower"},
        {"name": "install_warm_seconds", "value": round(warm, 3), "unit": "s", "target": None, "better": "lower"},
    ]
    if cold is not None:
        results.append(
            {"name": "install_cold_seconds", "value": round(cold, 1), "unit": "s", "target": None, "better": "lower"}
        )
    write_results("engine", results)


def _idle_agent_figure() -> float | None:
    """bench/agent_cost.py's last figure for an agent with idle engine groups, if it has run here."""
    found = ROOT / "bench" / "results" / "agent_cost.json"
    if not found.exists():
        return None
    for row in json.loads(found.read_text()):
        if row["name"] == "agent_cycle_cpu_ms":
            return row["value"]
    return None


if __name__ == "__main__":
    main()
