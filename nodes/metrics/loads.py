"""A node's load as sample lines, rendered once when its heartbeat arrives.

This is kube-state-metrics' idea: render an object's series when the object
changes, so that a scrape only concatenates. A node's load changes with every
heartbeat and is read by every scrape, so the heartbeat renders it, the lines
are stored in Redis beside the load, and a scrape at 10,000 nodes joins
strings instead of formatting 50,000 samples.

Shard lines are not rendered here: their `replica` and `model` labels come from
the allocations in the database, which the heartbeat does not read.
"""

from __future__ import annotations

from agent.protocol import Load
from nodes.metrics import families
from nodes.metrics.lines import labelset, line

WINDOWS = ("1m", "5m", "15m")


def render(node_id: str, load: Load) -> list[str]:
    """One string of sample lines per family of `families.NODE_LOAD`, in that order."""
    node = labelset(node=node_id)
    averages = (load.load1, load.load5, load.load15)
    return [
        line(families.CPU_UTILIZATION.name, node, load.cpu_percent),
        line(families.CPUS.name, node, load.cpus),
        "".join(
            line(families.LOAD.name, labelset(node=node_id, window=window), value)
            for window, value in zip(WINDOWS, averages, strict=True)
        ),
        line(families.MEMORY_USED.name, node, load.memory_used_bytes),
        line(families.MEMORY_AVAILABLE.name, node, load.memory_available_bytes),
    ]
