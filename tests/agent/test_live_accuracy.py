"""Real process groups measured by the agent and by psutil over the same window: within 10 %."""

import os
import sys
import threading
import time

import psutil
import pytest
import requests

from agent import protocol
from agent.load import Sampler
from agent.runner import Runner
from devstack.polling import wait_until
from devstack.ports import free_port, port_open

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# A parent that starts a child burning one core, then waits on it: two processes, one group.
BURNER = "import subprocess, sys; subprocess.Popen([sys.executable, '-c', 'while True: pass']).wait()"


def group_usage(pgid: int) -> dict[tuple[int, float], tuple[float, int]]:
    """psutil's view: CPU seconds and RSS of each process in the group, keyed like the agent keys them."""
    usage = {}
    for process in psutil.process_iter():
        try:
            if os.getpgid(process.pid) != pgid:
                continue
            with process.oneshot():
                times = process.cpu_times()
                usage[(process.pid, process.create_time())] = (times.user + times.system, process.memory_info().rss)
        except (psutil.NoSuchProcess, ProcessLookupError):
            continue
    return usage


def cores_between(before: dict, after: dict, seconds: float) -> float:
    return sum(cpu - before.get(key, (0.0, 0))[0] for key, (cpu, _) in after.items()) / seconds


@pytest.mark.slow
def test_agent_and_psutil_agree_on_cores_and_rss(tmp_path):
    port = free_port()
    engine = [sys.executable, "-m", "agent.demo_engine", "--port", str(port), "--cpu-ms-per-token", "5"]
    runner = Runner(tmp_path / "logs", env={"PYTHONPATH": ROOT})
    runner.reconcile(
        [
            protocol.ShardSpec(shard="demo", replica="r", model="demo", engine="command", command=engine, port=port),
            protocol.ShardSpec(
                shard="burner", replica="r", model="", engine="command", command=[sys.executable, "-c", BURNER]
            ),
        ]
    )
    stop = threading.Event()
    driver = None
    try:
        wait_until(lambda: port_open(port), 15, "the demo engine")
        groups = runner.process_groups()
        wait_until(lambda: len(group_usage(groups["burner"])) == 2, 10, "the burner's child")

        def drive():
            with requests.Session() as session:
                while not stop.is_set():
                    session.post(f"http://127.0.0.1:{port}/v1/completions", json={"prompt": "hi", "max_tokens": 8})

        driver = threading.Thread(target=drive, daemon=True)
        driver.start()
        time.sleep(0.5)  # let the load settle before the window opens

        sampler = Sampler()
        sampler.sample(groups)
        started = time.monotonic()
        before = {shard: group_usage(pgid) for shard, pgid in groups.items()}
        time.sleep(2.0)
        load = sampler.sample(groups)
        window = time.monotonic() - started
        after = {shard: group_usage(pgid) for shard, pgid in groups.items()}
    finally:
        stop.set()
        if driver is not None:
            driver.join(10)
        runner.stop_all(grace=2)

    agent = {s.shard: s for s in load.shards}
    for shard in groups:
        psutil_cores = cores_between(before[shard], after[shard], window)
        psutil_rss = sum(rss for _, rss in after[shard].values())
        ours = agent[shard]
        seen = f"agent {ours.cpu_cores:.3f} cores, {ours.rss_bytes} B; psutil {psutil_cores:.3f}, {psutil_rss} B"
        assert psutil_cores > 0.05, f"{shard} was idle: the comparison would prove nothing"
        assert ours.cpu_cores == pytest.approx(psutil_cores, rel=0.10), f"{shard}: {seen}"
        assert ours.rss_bytes == pytest.approx(psutil_rss, rel=0.10), f"{shard}: {seen}"
