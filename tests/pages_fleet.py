"""A fleet of any size, made in bulk, for the page tests and the pages benchmark."""

from __future__ import annotations

import time
from datetime import timedelta

from django.utils import timezone

import livestate
from agent.protocol import Load, ShardLoad
from inventory.models import GPU, AdminState, Allocation, Filesystem, GPUClaim, Liveness, Node, gpu_class
from livestate import loadstore

GPU_NAME = "NVIDIA H100 80GB HBM3"
GPUS_PER_NODE = 8


def make_fleet(count: int, prefix: str = "n", with_loads: bool = True, now: float | None = None) -> list[str]:
    """`count` nodes in varied states, each with 8 GPUs, two filesystems, one allocation and a load."""
    now = now if now is not None else time.time()
    heartbeat = timezone.now()
    states = [
        (AdminState.ACTIVE, Liveness.ALIVE),
        (AdminState.ACTIVE, Liveness.ALIVE),
        (AdminState.ACTIVE, Liveness.ALIVE),
        (AdminState.CORDONED, Liveness.ALIVE),
        (AdminState.DRAINING, Liveness.ALIVE),
        (AdminState.ACTIVE, Liveness.UNREACHABLE),
        (AdminState.ACTIVE, Liveness.LOST),
    ]
    nodes = []
    for i in range(count):
        admin_state, liveness = states[i % len(states)]
        nodes.append(
            Node(
                id=f"{prefix}{i:05d}",
                hostname=f"{prefix}{i:05d}.rack{i % 40}.example",
                labels={"rack": f"r{i % 40}", "zone": "a" if i % 2 else "b"},
                memory_total_bytes=512 * 2**30,
                os="Debian GNU/Linux",
                kernel="6.1.0",
                arch="x86_64",
                cpu_model="AMD EPYC 9654",
                cpus=192,
                agent_version="0.1.0",
                admin_state=admin_state,
                liveness=liveness,
                last_heartbeat=heartbeat - timedelta(seconds=i % 20),
            )
        )
    Node.objects.bulk_create(nodes, batch_size=1000)
    klass = gpu_class(GPU_NAME, 80 * 2**30)
    GPU.objects.bulk_create(
        [
            GPU(node=node, index=g, name=GPU_NAME, gpu_class=klass, memory_bytes=80 * 2**30, uuid=f"GPU-{node.pk}-{g}")
            for node in nodes
            for g in range(GPUS_PER_NODE)
        ],
        batch_size=2000,
    )
    Filesystem.objects.bulk_create(
        [
            fs
            for node in nodes
            for fs in (
                Filesystem(node=node, mount="/models", fstype="ext4", total_bytes=4 * 2**40, free_bytes=2**40),
                Filesystem(
                    node=node, mount="/shared", fstype="nfs", total_bytes=100 * 2**40, free_bytes=2**42, shared=True
                ),
            )
        ],
        batch_size=2000,
    )
    allocations = Allocation.objects.bulk_create(
        [
            Allocation(
                node=node, shard_id=f"{node.pk}-s0", replica_id=f"{node.pk}-r0", model="llama-3-70b", memory_gb=64
            )
            for node in nodes
        ],
        batch_size=2000,
    )
    GPUClaim.objects.bulk_create(
        [GPUClaim(allocation=a, node_id=a.node_id, gpu_index=g) for a in allocations for g in range(4)],
        batch_size=2000,
    )
    if with_loads:
        pipe = livestate.client().pipeline(transaction=False)
        for i, node in enumerate(nodes):
            loadstore.save(node.pk, fleet_load(i, f"{node.pk}-s0"), now - (i % 10), pipe=pipe)
        pipe.execute()
    return [node.pk for node in nodes]


def fleet_load(i: int, shard: str) -> Load:
    return Load(
        cpu_percent=float(i * 7 % 100),
        cpus=192,
        load1=(i % 50) / 2,
        load5=(i % 40) / 2,
        load15=(i % 30) / 2,
        memory_used_bytes=(64 + i % 400) * 2**30,
        memory_available_bytes=(448 - i % 400) * 2**30,
        interval_seconds=5.0,
        shards=[ShardLoad(shard=shard, cpu_cores=3.5, rss_bytes=40 * 2**30)],
    )
