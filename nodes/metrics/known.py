"""Only what the inventory holds: the GPU lines of a node's load that /metrics may export.

A load is the agent's word, rendered when its heartbeat arrives; the inventory
and placement are the control plane's. One node's heartbeat naming 64 GPUs at
index 0 with invented uuids, and 64 invented shards, added some 384 series to
every scrape, new ones with each change (issue 22). So a GPU's load lines are
exported only for a GPU the inventory holds, by index and uuid (the shards',
only for a shard allocated to the node: nodes/metrics/collector.py). The usual
case costs one comparison a node: the load's GPU records
(livestate/loadlines.py) equal the inventory's; only a node whose differ has
its GPU lines read one by one. A load naming only GPUs the inventory holds
(some of them, or none: an agent with no GPU figures this time) is exported
as it is too, since every line it has is of a GPU the records name; at 10,000
nodes of 8 GPUs whose loads carried no GPU figures, reading each one's lines
cost a render some 0.2 s of CPU (docs/operations.md, "The render in half the CPU").
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from livestate import loadlines
from livestate.samples import labelset

# Where the GPU families sit among a stored load's chunks.
_GPU_CHUNKS = range(len(loadlines.NODE_LOAD), len(loadlines.STORED))


def gpu_records(nodes: Iterable[str], records: Iterable[bytes]) -> dict[str, bytes]:
    """Each node's GPUs as a load's GPU records list them, from the inventory's rows in (node, index) order."""
    grouped: dict[str, list[bytes]] = {}
    for node, record in zip(nodes, records, strict=True):
        grouped.setdefault(node, []).append(record)
    return {node: b"".join(parts) for node, parts in grouped.items()}


def held_chunks(fresh: Sequence[tuple[str, loadlines.Rendered]], held: dict[str, bytes]) -> list[list[bytes]]:
    """Each fresh load's chunks, its GPU families keeping only lines of GPUs the inventory holds."""
    exported = []
    for node_id, stored in fresh:
        records = held.get(node_id, b"")
        exported.append(
            stored.chunks if _all_held(stored.gpus, records) else _only_held(node_id, stored.chunks, records)
        )
    return exported


def _all_held(named: bytes, records: bytes) -> bool:
    """Whether every GPU a load's records name is among the inventory's records (mostly: all of them, equal)."""
    return named == records or not named or set(named.splitlines()) <= set(records.splitlines())


def _only_held(node_id: str, chunks: list[bytes], records: bytes) -> list[bytes]:
    allowed = set()
    for record in records.splitlines():
        index, uuid = record.split(loadlines.FIELD_SEPARATOR)
        allowed.add(labelset(gpu=index.decode(), node=node_id, uuid=uuid.decode()).encode())
    kept = list(chunks)
    for position in _GPU_CHUNKS:
        # A load's uuid and node id hold no "}" (protocol.GPUUuid, NodeId): the first one closes the labels.
        kept[position] = b"".join(
            line + b"\n"
            for line in chunks[position].splitlines()
            if line[line.index(b"{") : line.index(b"}") + 1] in allowed
        )
    return kept
