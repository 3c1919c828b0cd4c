"""The agent's load against node_exporter's counters over the same 30 s window.

One run: node_exporter is scraped and the agent's sampler reads /proc at the start
and at the end of one window, while a child process keeps part of a core busy so
that the figure is not trivially zero. node_exporter's counters are evaluated with
the usual rules: CPU % from the increase of `node_cpu_seconds_total` per mode (both
docs/design.md's busy/total split and the common `1 - idle` rule are shown), memory
from `node_memory_MemAvailable_bytes`, load from `node_load1/5/15`.

    python -m bench.agent_accuracy [--window SECONDS]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from collections import defaultdict

from agent.load import Sampler
from bench.agent_cost import NodeExporter, write_results

BUSY = ("user", "nice", "system", "irq", "softirq")
NOT_BUSY = ("idle", "iowait", "steal")
# Busy for 30 ms of every 60: about half a core, so there is something to measure.
BURNER = """
import time
while True:
    end = time.monotonic() + 0.03
    while time.monotonic() < end:
        pass
    time.sleep(0.03)
"""


def parse(text: str) -> dict:
    cpu: defaultdict[str, float] = defaultdict(float)
    values = {}
    for line in text.splitlines():
        if line.startswith("#") or not line:
            continue
        name, value = line.rsplit(" ", 1)
        if name.startswith("node_cpu_seconds_total{"):
            mode = name.split('mode="', 1)[1].split('"', 1)[0]
            cpu[mode] += float(value)  # summed over the CPUs, as sum by (mode) would
        else:
            values[name] = float(value)
    return {"cpu": cpu, **values}


def row(name: str, value: float, unit: str, target: float | None) -> dict:
    return {"name": name, "value": value, "unit": unit, "target": target, "better": "lower"}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--window", type=float, default=30.0)
    args = parser.parse_args()
    exporter = NodeExporter()
    burner = subprocess.Popen([sys.executable, "-c", BURNER])
    try:
        sampler = Sampler()
        time.sleep(1)
        first = parse(exporter.scrape())
        sampler.sample({})
        time.sleep(args.window)
        # Both readings within a few milliseconds, the agent's first: the load
        # average changes only every 5 s, so both should then see the same one.
        load = sampler.sample({})
        last = parse(exporter.scrape())
        assert load is not None, "a second sample makes a load"
    finally:
        burner.kill()
        burner.wait()
        exporter.stop()

    delta = {mode: last["cpu"][mode] - first["cpu"][mode] for mode in last["cpu"]}
    busy = sum(delta.get(m, 0.0) for m in BUSY)
    total = busy + sum(delta.get(m, 0.0) for m in NOT_BUSY)
    exporter_cpu = 100 * busy / total
    exporter_cpu_idle_rule = 100 * (1 - delta["idle"] / sum(delta.values()))
    exporter_available = last["node_memory_MemAvailable_bytes"]
    exporter_load = (last["node_load1"], last["node_load5"], last["node_load15"])
    ours = (load.load1, load.load5, load.load15)
    memory_error = 100 * abs(load.memory_available_bytes - exporter_available) / exporter_available

    print(f"window {load.interval_seconds:.2f} s; CPU seconds by mode: { {m: round(v, 2) for m, v in delta.items()} }")
    print(f"agent:         CPU {load.cpu_percent:.2f} %, available {load.memory_available_bytes} B, load {ours}")
    print(
        f"node_exporter: CPU {exporter_cpu:.2f} % (1 - idle: {exporter_cpu_idle_rule:.2f} %), "
        f"available {exporter_available:.0f} B, load {exporter_load}"
    )
    write_results(
        "agent_accuracy",
        [
            row("agent_cpu_percent", round(load.cpu_percent, 2), "%", None),
            row("node_exporter_cpu_percent", round(exporter_cpu, 2), "%", None),
            row("cpu_difference_pp", round(abs(load.cpu_percent - exporter_cpu), 2), "pp", 2),
            row("cpu_difference_vs_idle_rule_pp", round(abs(load.cpu_percent - exporter_cpu_idle_rule), 2), "pp", 2),
            row("memory_available_difference", round(memory_error, 3), "%", 1),
            row("load_averages_differing", sum(a != b for a, b in zip(ours, exporter_load, strict=True)), "of 3", 0),
        ],
    )


if __name__ == "__main__":
    main()
