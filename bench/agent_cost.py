"""What the agent costs a node: CPU per sample-and-beat cycle and resident memory, beside node_exporter.

Side by side in one run: the agent runs as its own process (`python -m agent`) with
4 engine groups of 50 processes each, heartbeating every second to a stand-in control
plane in this process, while `prometheus-node-exporter` (Debian's package) is scraped
once a second. CPU is read from /proc/<pid>/task/*/schedstat (nanoseconds, all
threads) around each agent heartbeat and each scrape; the medians are reported.

    python -m bench.agent_cost              # both parts (make bench)
    python -m bench.agent_cost --big-host   # the sampler on a 100,000-process fixture only

Run from the repository root, as a module (the project is not installed): its
child processes are started the same way (`sampler_command`).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from functools import partial
from pathlib import Path

import psutil
import requests

from devstack.fakecp import FakeControlPlane
from devstack.polling import wait_until
from devstack.ports import free_port, port_open

ROOT = Path(__file__).resolve().parent.parent

GROUPS = 4
PER_GROUP = 50
CYCLES = 30
NODE_EXPORTER = "/usr/bin/prometheus-node-exporter"


def cpu_ns(pid: int) -> int:
    """CPU time of every thread of `pid`, in ns (schedstat's first field; far finer than utime's 10 ms)."""
    total = 0
    for task in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{task}/schedstat") as f:
                total += int(f.read().split()[0])
        except (OSError, ValueError, IndexError):
            continue
    return total


class NodeExporter:
    """prometheus-node-exporter with its default collectors, on a free loopback port."""

    def __init__(self):
        binary = shutil.which("prometheus-node-exporter") or NODE_EXPORTER
        if not os.path.exists(binary):
            sys.exit("prometheus-node-exporter is not installed: apt-get install prometheus-node-exporter")
        self.port = free_port()
        self.process = subprocess.Popen(
            [binary, f"--web.listen-address=127.0.0.1:{self.port}"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        wait_until(lambda: port_open(self.port), 15, "node_exporter")
        self.session = requests.Session()

    def scrape(self) -> str:
        return self.session.get(f"http://127.0.0.1:{self.port}/metrics", timeout=10).text

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(10)


def write_results(name: str, rows: list[dict]) -> None:
    out = ROOT / "bench" / "results" / f"{name}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(rows, indent=2) + "\n")
    print()
    print("| figure | value | unit | target |")
    print("| --- | ---: | --- | ---: |")
    for row in rows:
        target = "" if row["target"] is None else f"{'≤' if row['better'] == 'lower' else '≥'} {row['target']}"
        print(f"| {row['name']} | {row['value']} | {row['unit']} | {target} |")
    print(f"\nwritten to {out.relative_to(ROOT)}")


def main() -> None:
    var = Path(tempfile.mkdtemp(prefix="agent-cost-"))
    group = f"for i in $(seq {PER_GROUP - 1}); do sleep 600 & done; wait"
    shards = "".join(f"  - {{shard: g{i}, engine: command, command: [sh, -c, '{group}']}}\n" for i in range(GROUPS))
    (var / "join").write_text("join-secret")
    config = var / "agent.yaml"
    config.write_text(
        f"join_token_file: {var / 'join'}\nstate_dir: {var / 'state'}\ninterval: 1\nengines: {{}}\nshards:\n{shards}"
    )
    exporter = NodeExporter()
    with FakeControlPlane(interval=1.0) as plane:
        config.write_text(f"control_plane: {plane.url}\n" + config.read_text())
        agent = subprocess.Popen(
            [sys.executable, "-m", "agent", "--config", str(config), "--log-level", "WARNING"], cwd=ROOT
        )
        try:

            def groups_full() -> bool:
                beats = list(plane.heartbeats)
                return bool(beats) and len(beats[-1].load.shards if beats[-1].load else []) == GROUPS

            wait_until(groups_full, 60, "the agent to report 4 groups")
            pgids = [s.pid for s in list(plane.heartbeats)[-1].shards]
            members = sum(1 for p in psutil.process_iter() if _pgid(p.pid) in pgids)
            for _ in range(3):
                exporter.scrape()  # warm-up: the first scrapes allocate

            agent_cycles: list[float] = []
            scrapes: list[float] = []
            seen, last = plane.accepted(), cpu_ns(agent.pid)
            while len(agent_cycles) < CYCLES:
                before = cpu_ns(exporter.process.pid)
                exporter.scrape()
                scrapes.append((cpu_ns(exporter.process.pid) - before) / 1e6)
                wait_until(partial(plane.accepted_more_than, seen), 10, "the next heartbeat", interval=0.002)
                now = cpu_ns(agent.pid)
                # The heartbeat just arrived: the agent's cycle (sample, poll, beat) is over.
                agent_cycles.append((now - last) / 1e6 / (plane.accepted() - seen))
                seen, last = plane.accepted(), now
            agent_rss = psutil.Process(agent.pid).memory_info().rss / 2**20
            exporter_rss = psutil.Process(exporter.process.pid).memory_info().rss / 2**20
        finally:
            agent.terminate()
            agent.wait(30)
            exporter.stop()
            shutil.rmtree(var, ignore_errors=True)

    agent_ms = statistics.median(agent_cycles)
    exporter_ms = statistics.median(scrapes)
    print(f"agent: {GROUPS} groups holding {members} processes, {CYCLES} cycles at 1 s")
    print(f"node_exporter: {len(scrapes)} scrapes, one a cycle, in the same window")
    print(f"agent cycle CPU ms, sorted: {sorted(round(c, 2) for c in agent_cycles)}")
    print(f"node_exporter scrape CPU ms, sorted: {sorted(round(s, 2) for s in scrapes)}")
    write_results(
        "agent_cost",
        [
            {
                "name": "agent_cycle_cpu_ms",
                "value": round(agent_ms, 2),
                "unit": "ms",
                "target": round(exporter_ms, 2),
                "better": "lower",
            },
            {"name": "agent_rss_mb", "value": round(agent_rss, 1), "unit": "MiB", "target": 40, "better": "lower"},
            {
                "name": "node_exporter_scrape_cpu_ms",
                "value": round(exporter_ms, 2),
                "unit": "ms",
                "target": None,
                "better": "lower",
            },
            {
                "name": "node_exporter_rss_mb",
                "value": round(exporter_rss, 1),
                "unit": "MiB",
                "target": None,
                "better": "lower",
            },
            {
                "name": "agent_cycle_over_scrape",
                "value": round(agent_ms / exporter_ms, 2),
                "unit": "ratio",
                "target": 1.0,
                "better": "lower",
            },
        ],
    )


def _pgid(pid: int) -> int:
    try:
        return os.getpgid(pid)
    except ProcessLookupError:
        return -1


# -- a big host: 4,096 CPUs, 100,000 processes, two engines (a fixture /proc) ------------------

BIG_PROCESSES = 100_000
BIG_CPUS = 4096
BIG_ENGINES = [(32, 8), (32, 8)]  # each: workers, and processes those forked
BIG_STEADY = 10
BIG_NEW_PER_INTERVAL = 50  # unrelated processes started between two samples


def big_host() -> list[dict]:
    """First-sample and steady-sample CPU and RSS of the agent's sampler on a 100,000-process fixture.

    The sampler runs in a child process that imports what the agent imports, so its RSS
    is the agent's; this process builds the fixture and moves its counters between
    samples. Measured twice: engines in cgroups of their own, and walked (no cgroups).
    """
    import time

    from tests.agent import bigproc

    rows = []
    for mode in ("cgroup", "walk"):
        # In memory, as the real /proc is: on disk the fixture would measure the disk, not the agent.
        shm = "/dev/shm" if os.path.isdir("/dev/shm") else None
        work = Path(tempfile.mkdtemp(prefix="agent-big-host-", dir=shm))
        try:
            started = time.monotonic()
            host = bigproc.build(work / "proc", BIG_PROCESSES, BIG_CPUS, BIG_ENGINES, after=100)
            root = bigproc.cgroup_root(work / "cgroup")
            fakes = [
                bigproc.FakeCgroup(root / f"engine-e{i}", 10**6, 2**30, engine.pids).write()
                for i, engine in enumerate(host.engines)
            ]
            print(f"{mode}: fixture of {host.total} pids built in {time.monotonic() - started:.0f} s", flush=True)
            leaders = ",".join(str(engine.leader) for engine in host.engines)
            child = subprocess.Popen(
                sampler_command(host.root, root, mode, leaders),
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
                cwd=ROOT,
            )
            readings = [_ask(child)]  # the imports, before any sample
            readings.append(_ask(child))  # the first sample
            for _ in range(BIG_STEADY):
                host.advance(5.0, ticks_per_process=20, new_host_processes=BIG_NEW_PER_INTERVAL)
                for fake in fakes:
                    fake.usage_usec += 5_000_000
                    fake.write()
                readings.append(_ask(child))
            if child.stdin is not None:
                child.stdin.close()
            child.wait(30)
        finally:
            shutil.rmtree(work, ignore_errors=True)
        steady = [r["cpu_ms"] for r in readings[2:]]
        steady_ms = statistics.median(steady)
        print(f"{mode}: steady sample CPU ms, sorted: {sorted(round(c, 2) for c in steady)}")
        rows += [
            {"name": f"big_host_{mode}_first_sample_cpu_ms", "value": round(readings[1]["cpu_ms"], 1), "unit": "ms"},
            {
                "name": f"big_host_{mode}_steady_sample_cpu_ms",
                "value": round(steady_ms, 2),
                "unit": "ms",
            },
            {"name": f"big_host_{mode}_rss_before_mb", "value": round(readings[0]["rss_mb"], 1), "unit": "MiB"},
            {"name": f"big_host_{mode}_rss_mb", "value": round(readings[-1]["rss_mb"], 1), "unit": "MiB", "target": 40},
            {"name": f"big_host_{mode}_peak_rss_mb", "value": round(readings[-1]["peak_mb"], 1), "unit": "MiB"},
        ]
    for row in rows:
        row.setdefault("target", None)
        row["better"] = "lower"
    return rows


def sampler_command(proc: Path, cgroup_root: Path, mode: str, leaders: str) -> list[str]:
    """The child's command line, run from the repository root: as a module, like every benchmark,
    so that it imports `agent` from the checkout (a script's own folder, bench/, would not hold it)."""
    return [sys.executable, "-m", "bench.agent_cost", "--sample-fixture", str(proc), str(cgroup_root), mode, leaders]


def _ask(child: subprocess.Popen) -> dict:
    assert child.stdin is not None and child.stdout is not None  # both PIPE
    child.stdin.write("sample\n")
    child.stdin.flush()
    return json.loads(child.stdout.readline())


def sample_fixture(proc: str, cgroup_root: str, mode: str, leaders: str) -> None:
    """The child: answer each line on stdin with one sample's CPU time and the RSS after it."""
    import time

    import agent.loop  # noqa: F401  (everything the running agent imports, so the RSS is comparable)
    from agent import cgroups
    from agent.load import Sampler

    groups = {f"e{i}": int(pid) for i, pid in enumerate(leaders.split(","))}
    placements: dict[str, cgroups.Placement] = {}
    if mode == "cgroup":
        for shard in groups:
            placement = cgroups.Cgroups(Path(cgroup_root)).place(shard)
            if placement is not None:
                placements[shard] = placement
    sampler = Sampler(Path(proc))
    first = True
    for _ in sys.stdin:
        cpu = time.process_time()
        if not first:
            sampler.sample(groups, placements)
        spent = time.process_time() - cpu
        # The first answer is the baseline (imports only); every later one is a sample.
        status = dict(line.split(":", 1) for line in Path("/proc/self/status").read_text().splitlines())
        rss, peak = (int(status[key].split()[0]) / 1024 for key in ("VmRSS", "VmHWM"))
        print(json.dumps({"cpu_ms": spent * 1000, "rss_mb": rss, "peak_mb": peak}), flush=True)
        first = False


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--big-host", action="store_true", help="only the sampler on a 100,000-process fixture")
    parser.add_argument(
        "--sample-fixture",
        nargs=4,
        metavar=("PROC", "CGROUP_ROOT", "MODE", "LEADERS"),
        help="the big host's child: answer each line on stdin with one sample (started by the benchmark itself)",
    )
    return parser.parse_args(argv)


if __name__ == "__main__":
    args = parse_args()
    if args.sample_fixture:
        sample_fixture(*args.sample_fixture)
    elif args.big_host:
        write_results("agent_cost_big_host", big_host())
    else:
        main()
        write_results("agent_cost_big_host", big_host())
