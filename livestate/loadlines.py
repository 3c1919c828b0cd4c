"""A node's load as sample lines, rendered once when its heartbeat arrives.

This is kube-state-metrics' idea: render an object's series when the object
changes, so that a scrape only concatenates. A node's load changes with every
heartbeat and is read by every scrape, so the heartbeat renders it and
livestate.loadstore keeps the text beside the load; a scrape at 10,000 nodes then joins
byte strings instead of formatting 150,000 samples.

The text, as stored:

    <received_at>\\n<lines of family 0>\\x1e … <lines of family 8>\\x1e<GPU records>\\x1e<shard records>

with the families of `STORED` in order (the node's, then its GPUs', one line
per GPU that gave the figure, one GPU per index), one record per GPU rendered,
`<index>\\x1f<uuid>\\n` in the order of their indices, and one record per shard,
`<shard>\\x1f<cpu cores>\\x1f<resident bytes>\\n`, its values already formatted.
Shard lines themselves are finished at the scrape: their `replica` and `model`
labels come from the allocations in the database, which a heartbeat does not
read. The GPU records let the scrape check in one comparison that the GPU
lines name only GPUs the inventory holds (nodes/metrics/known.py). Node and
shard ids and GPU uuids cannot hold the separators (protocol.NodeId, GPUUuid).
"""

from __future__ import annotations

from functools import lru_cache
from typing import NamedTuple

from agent.protocol import GPULoad, Load
from livestate.samples import labelset, line, value


class Family(NamedTuple):
    """A /metrics family: its name, help text and type (nodes/metrics/families.py lists them all)."""

    name: str
    documentation: str
    type: str = "gauge"

    @property
    def sample(self) -> str:
        """The name its samples carry (an info family's samples end in `_info`)."""
        return self.name + "_info" if self.type == "info" else self.name


# From each node's latest load, while it is fresh (LLMGW_LOAD_MAX_AGE). Defined
# here because their names are part of the text a heartbeat stores.
CPU_UTILIZATION = Family("llmgw_node_cpu_utilization_percent", "CPU busy across all cores over the last interval.")
CPUS = Family("llmgw_node_cpus", "Logical CPUs the node's load was measured on.")
LOAD = Family("llmgw_node_load", "Load average over the window 1m, 5m or 15m.")
MEMORY_USED = Family("llmgw_node_memory_used_bytes", "Memory used: MemTotal minus MemAvailable.")
MEMORY_AVAILABLE = Family("llmgw_node_memory_available_bytes", "Memory available (MemAvailable).")

GPU_UTILIZATION = Family("llmgw_gpu_utilization_percent", "Time the GPU was busy over NVML's last sample period.")
GPU_MEMORY_USED = Family("llmgw_gpu_memory_used_bytes", "GPU memory in use, as NVML reports it.")
GPU_TEMPERATURE = Family("llmgw_gpu_temperature_celsius", "GPU core temperature.")
GPU_POWER = Family("llmgw_gpu_power_watts", "GPU power draw.")

NODE_LOAD = (CPU_UTILIZATION, CPUS, LOAD, MEMORY_USED, MEMORY_AVAILABLE)
# Each GPU's figures, labelled node, gpu (its index) and uuid, from the load's `gpus`.
GPU_LOAD = (GPU_UTILIZATION, GPU_MEMORY_USED, GPU_TEMPERATURE, GPU_POWER)
# The families a heartbeat renders, in the order of the stored text.
STORED = (*NODE_LOAD, *GPU_LOAD)

WINDOWS = ("1m", "5m", "15m")
FAMILY_SEPARATOR = b"\x1e"
FIELD_SEPARATOR = b"\x1f"


def render(node_id: str, load: Load, received_at: float) -> bytes:
    cpu, cpus, load1, load5, load15, used, available = _prefixes(node_id)
    # One GPU per index (the last, as for an inventory): a series per index at most.
    gpus = sorted({gpu.index: gpu for gpu in load.gpus}.values(), key=lambda gpu: gpu.index)
    parts = (
        f"{cpu}{value(load.cpu_percent)}\n",
        f"{cpus}{value(load.cpus)}\n",
        f"{load1}{value(load.load1)}\n{load5}{value(load.load5)}\n{load15}{value(load.load15)}\n",
        f"{used}{value(load.memory_used_bytes)}\n",
        f"{available}{value(load.memory_available_bytes)}\n",
        *_gpu_chunks(node_id, gpus),
        "".join(gpu_record(gpu.index, gpu.uuid) for gpu in gpus),
        "".join(f"{s.shard}\x1f{value(s.cpu_cores)}\x1f{value(s.rss_bytes)}\n" for s in load.shards),
    )
    return f"{received_at!r}\n{_FAMILY_SEPARATOR.join(parts)}".encode()


_FAMILY_SEPARATOR = FAMILY_SEPARATOR.decode()


# Every heartbeat renders the same names and label sets for its node; building
# and escaping them was a third of the rendering (docs/operations.md). Each web
# process keeps them for every node it has seen: a few hundred bytes a node.
@lru_cache(maxsize=65536)
def _prefixes(node_id: str) -> tuple[str, ...]:
    """Each sample's `name{labels} ` for this node, in the order `render` writes them."""
    node = labelset(node=node_id)
    windows = [labelset(node=node_id, window=window) for window in WINDOWS]
    return (
        f"{CPU_UTILIZATION.name}{node} ",
        f"{CPUS.name}{node} ",
        *(f"{LOAD.name}{labels} " for labels in windows),
        f"{MEMORY_USED.name}{node} ",
        f"{MEMORY_AVAILABLE.name}{node} ",
    )


def _gpu_chunks(node_id: str, gpus: list[GPULoad]) -> list[str]:
    """One chunk per GPU_LOAD family; a figure the GPU did not give has no line."""
    chunks: list[list[str]] = [[] for _ in GPU_LOAD]
    for gpu in gpus:
        labels = labelset(gpu=str(gpu.index), node=node_id, uuid=gpu.uuid)
        figures = (gpu.utilization_percent, gpu.memory_used_bytes, gpu.temperature_celsius, gpu.power_watts)
        for chunk, family, figure in zip(chunks, GPU_LOAD, figures, strict=True):
            if figure is not None:
                chunk.append(line(family.name, labels, figure))
    return ["".join(chunk) for chunk in chunks]


def gpu_record(index: int, uuid: str) -> str:
    """A GPU as the stored text's GPU records list it; the scrape builds the inventory's the same way.

    An inventory's uuid is any text, a load's never holds a separator (protocol.GPUUuid): a GPU
    whose uuid does has no record, as no load can name it.
    """
    if "\n" in uuid or "\x1f" in uuid:
        return ""
    return f"{index}\x1f{uuid}\n"


class Rendered(NamedTuple):
    """A stored text taken apart: one chunk per STORED family, the GPU records as stored, and
    (shard, cores, bytes) records."""

    received_at: float
    chunks: list[bytes]
    gpus: bytes
    shards: list[list[bytes]]


def parse(raw: bytes | None) -> Rendered | None:
    """None for a missing or unreadable text."""
    if not raw:
        return None
    head, _, body = raw.partition(b"\n")
    parts = body.split(FAMILY_SEPARATOR)
    if len(parts) != len(STORED) + 2:
        return None
    try:
        received_at = float(head)
    except ValueError:
        return None
    shards = [record.split(FIELD_SEPARATOR) for record in parts[-1].splitlines()]
    if any(len(record) != 3 for record in shards):
        return None
    return Rendered(received_at, parts[:-2], parts[-2], shards)
