"""A simulated fleet written straight into the database and the load store, for tests and benches.

Bulk inserts rather than registrations: thousands of nodes in seconds. Each
node has `gpus` H100s, one local and one shared filesystem, and `shards`
allocations of two GPUs each (as many as fit), every shard running.
"""

from __future__ import annotations

from datetime import UTC, datetime

import livestate
from agent import protocol
from inventory.models import GPU, Allocation, Filesystem, GPUClaim, Node, gpu_class
from livestate import loadstore

GPU_NAME = "NVIDIA H100 80GB HBM3"
MODEL = "meta-llama/Llama-3.1-70B-Instruct"


def node_id(index: int) -> str:
    return f"node-{index:05d}"


def build(count: int, gpus: int = 8, shards: int = 4, at: float | None = None) -> list[str]:
    """Create `count` nodes with their hardware and allocations; returns their ids."""
    heartbeat = datetime.fromtimestamp(at, UTC) if at is not None else None
    ids = [node_id(i) for i in range(count)]
    Node.objects.bulk_create(
        Node(
            id=nid,
            hostname=f"{nid}.example",
            memory_total_bytes=512 * 2**30,
            os="Debian GNU/Linux",
            os_version="12",
            kernel="6.1.0",
            arch="x86_64",
            cpu_model="AMD EPYC 9654",
            cpus=192,
            agent_version="0.1.0",
            last_heartbeat=heartbeat,
        )
        for nid in ids
    )
    klass = gpu_class(GPU_NAME, 80 * 2**30)
    GPU.objects.bulk_create(
        GPU(node_id=nid, index=i, uuid=f"GPU-{nid}-{i}", name=GPU_NAME, gpu_class=klass, memory_bytes=80 * 2**30)
        for nid in ids
        for i in range(gpus)
    )
    Filesystem.objects.bulk_create(
        fs
        for nid in ids
        for fs in (
            Filesystem(node_id=nid, mount="/models", fstype="xfs", total_bytes=4 * 2**40, free_bytes=3 * 2**40),
            Filesystem(
                node_id=nid, mount="/shared", fstype="nfs", total_bytes=100 * 2**40, free_bytes=2**40, shared=True
            ),
        )
    )
    per_node = min(shards, gpus // 2) if gpus else shards
    allocations = Allocation.objects.bulk_create(
        Allocation(node_id=nid, shard_id=shard_id(nid, s), replica_id=f"r-{nid}-{s}", model=MODEL, memory_gb=64)
        for nid in ids
        for s in range(per_node)
    )
    if gpus:
        # Allocations come back in the order given: shard s of each node holds GPUs 2s and 2s + 1.
        GPUClaim.objects.bulk_create(
            GPUClaim(allocation_id=allocation.pk, node_id=allocation.node_id, gpu_index=2 * (n % per_node) + k)
            for n, allocation in enumerate(allocations)
            for k in range(2)
        )
    return ids


def shard_id(nid: str, index: int) -> str:
    return f"s-{nid}-{index}"


def load_of(nid: str, shards: int = 4, seed: int = 0) -> protocol.Load:
    return protocol.Load(
        cpu_percent=12.5 + seed % 80,
        cpus=192,
        load1=3.25,
        load5=2.5,
        load15=1.75,
        memory_used_bytes=200 * 2**30,
        memory_available_bytes=312 * 2**30,
        interval_seconds=5.0,
        shards=[
            protocol.ShardLoad(shard=shard_id(nid, s), cpu_cores=1.5 + s, rss_bytes=(8 + s) * 2**30)
            for s in range(shards)
        ],
    )


def save_loads(ids: list[str], received_at: float, shards: int = 4) -> None:
    """Every node's load through loadstore.save, in batched pipelines."""
    pipe = livestate.client().pipeline(transaction=False)
    for n, nid in enumerate(ids):
        loadstore.save(nid, load_of(nid, shards, seed=n), received_at, pipe=pipe)
        if n % 1000 == 999:
            pipe.execute()
    pipe.execute()
