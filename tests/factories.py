"""Every builder the tests and the benchmarks share: nodes, deployments, placements, fleets.

Small cases go through production's own entry points: a node is what
`upsert_inventory` makes of its agent's report, and a placed shard is what
`reconcile.record_placements` writes. Only the bulk fleets (thousands of
nodes, for page, /metrics and placement benchmarks) write rows directly,
because registering 10,000 nodes one by one would take longer than the
benchmark; they write the same rows registration and placement would.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from datetime import UTC, datetime, timedelta

from django.utils import timezone

import livestate
from agent import protocol
from agent.protocol import Load, ShardLoad
from inventory.models import (
    GPU,
    AdminState,
    Allocation,
    Deployment,
    Engine,
    FabricAttachment,
    Filesystem,
    GPUClaim,
    Liveness,
    Node,
    Replica,
    Shard,
    gpu_class,
)
from inventory.placement import FIRST_ENGINE_PORT, Placement, ShardPlacement
from inventory.reconcile import record_placements
from inventory.registration import upsert_inventory
from inventory.replicas import new_replicas
from livestate import loadstore

H100 = "NVIDIA H100 80GB HBM3"
H100_BYTES = 80 * 2**30
MODEL = "meta-llama/Llama-3.1-70B-Instruct"
# How long ago a node in each liveness last beat, so the stale sweep agrees with it.
SILENT_FOR: dict[str, int] = {Liveness.ALIVE: 1, Liveness.UNREACHABLE: 60, Liveness.LOST: 600}

# -- one node at a time, through registration ----------------------------------------------------


def make_inventory(hostname: str, gpus: int = 0, gpu_name: str = H100, **extra) -> protocol.Inventory:
    """An agent's inventory report: `gpus` GPUs of one name, and whatever `extra` protocol fields."""
    return protocol.Inventory(
        hostname=hostname,
        memory_total_bytes=extra.pop("memory_total_bytes", 512 * 2**30),
        host=protocol.Host(
            os="Debian GNU/Linux",
            os_version="12",
            kernel="6.1.0",
            arch="x86_64",
            cpu_model="AMD EPYC 9654",
            cpus=extra.pop("cpus", 192),
        ),
        agent_version="0.1.0",
        gpus=[
            protocol.GPU(index=i, uuid=f"GPU-{hostname}-{i}", name=gpu_name, memory_bytes=H100_BYTES)
            for i in range(gpus)
        ],
        **extra,
    )


def set_state(node_id: str, admin_state: str, liveness: str, now: datetime | None = None) -> None:
    """Put a registered node in a state, with a last heartbeat that matches its liveness."""
    now = now or timezone.now()
    Node.objects.filter(pk=node_id).update(
        admin_state=admin_state, liveness=liveness, last_heartbeat=now - timedelta(seconds=SILENT_FOR[liveness])
    )


def node(
    name: str,
    gpus: int = 8,
    gpu_name: str = H100,
    memory_gb: int = 512,
    cpus: int = 192,
    fabrics: dict[str, list[str]] | None = None,
    weights: list[str] | None = None,
    admin_state: str = AdminState.ACTIVE,
    liveness: str = Liveness.ALIVE,
    health: dict[int, str] | None = None,
) -> Node:
    """A node as its agent would report it, then put in the state asked for.

    `health` gives GPUs by index a reason they must not be used, as NVML would.
    """
    inventory = make_inventory(
        f"{name}.example",
        gpus=gpus,
        gpu_name=gpu_name,
        memory_total_bytes=memory_gb * 2**30,
        cpus=cpus,
        mgmt_addr=f"10.0.0.{abs(hash(name)) % 250 + 1}",
        fabrics=[protocol.Fabric(name=f, hcas=h) for f, h in (fabrics or {}).items()],
        weights=[protocol.Weights(path=p) for p in weights or []],
        weights_scanned=weights is not None,
    )
    for index, reason in (health or {}).items():
        inventory.gpus[index].health = reason
    now = timezone.now()
    created, _ = upsert_inventory(name, inventory, now=now)
    set_state(name, admin_state, liveness, now)
    created.refresh_from_db()
    return created


def deployment(name: str = "llama", **profile) -> Deployment:
    values = {
        "model_source": "meta-llama/Llama-3-8B",
        "engine": Engine.VLLM,
        "replicas": 1,
        "shards_per_replica": 1,
        "gpus_per_shard": 1,
        "gpu_class": "H100-80GB",
        **profile,
    }
    return Deployment.objects.create(name=name, **values)


def place(
    name: str,
    on: dict[str, Iterable[int]],
    memory_gb: int = 0,
    cpu_cores: int = 0,
    model: str = "org/model",
    fabric: str = "",
) -> Replica:
    """One replica of a new deployment `name`, a shard on each node of `on` holding those GPUs.

    Written by `record_placements`, as a reconcile pass writes what it placed,
    so the allocations, GPU claims and shard rows are the ones production
    makes; the replica id is `<name>-r1` and its shards `<name>-r1-s<i>`.
    """
    gpus = {node_id: sorted(indices) for node_id, indices in on.items()}
    made = Deployment.objects.create(
        name=name,
        model_source=model,
        engine=Engine.VLLM,
        replicas=1,
        shards_per_replica=len(gpus),
        gpus_per_shard=max((len(g) for g in gpus.values()), default=0),
        memory_gb_per_shard=memory_gb,
        cpu_cores_per_shard=cpu_cores,
    )
    (replica,) = new_replicas(made, 1, "placed by a test")
    replica.deployment = made
    shards = [
        ShardPlacement(i, node_id, indices, [], FIRST_ENGINE_PORT + Shard.objects.filter(node_id=node_id).count())
        for i, (node_id, indices) in enumerate(gpus.items())
    ]
    record_placements([(replica, Placement(shards, fabric))], timezone.now())
    replica.refresh_from_db()
    return replica


# -- fleets in bulk, for pages, /metrics and the benchmarks --------------------------------------


# What every bulk-built node's agent would have said of its host.
BULK_HOST = {
    "memory_total_bytes": 512 * 2**30,
    "os": "Debian GNU/Linux",
    "kernel": "6.1.0",
    "arch": "x86_64",
    "cpu_model": "AMD EPYC 9654",
    "cpus": 192,
    "agent_version": "0.1.0",
}


def node_id(index: int) -> str:
    return f"node-{index:05d}"


def shard_id(nid: str, index: int) -> str:
    return f"s-{nid}-{index}"


def _gpus(ids: Iterable[str], count: int, name: str = H100, memory_bytes: int = H100_BYTES) -> list[GPU]:
    klass = gpu_class(name, memory_bytes)
    return [
        GPU(node_id=nid, index=i, uuid=f"GPU-{nid}-{i}", name=name, gpu_class=klass, memory_bytes=memory_bytes)
        for nid in ids
        for i in range(count)
    ]


def _filesystems(ids: Iterable[str], local_free: int, shared_free: int, fstype: str) -> list[Filesystem]:
    """A local model filesystem and a shared one per node."""
    return [
        fs
        for nid in ids
        for fs in (
            Filesystem(node_id=nid, mount="/models", fstype=fstype, total_bytes=4 * 2**40, free_bytes=local_free),
            Filesystem(
                node_id=nid, mount="/shared", fstype="nfs", total_bytes=100 * 2**40, free_bytes=shared_free, shared=True
            ),
        )
    ]


def _allocations(shards: list[tuple[str, str, str, list[int]]], model: str, memory_gb: int) -> None:
    """(node, shard, replica, GPUs) as allocations with their GPU claims, the rows placement writes."""
    allocations = Allocation.objects.bulk_create(
        [
            Allocation(node_id=nid, shard_id=shard, replica_id=replica, model=model, memory_gb=memory_gb)
            for nid, shard, replica, _ in shards
        ],
        batch_size=2000,
    )
    # bulk_create returns the rows in the order given, with their keys.
    GPUClaim.objects.bulk_create(
        [
            GPUClaim(allocation_id=allocation.pk, node_id=allocation.node_id, gpu_index=index)
            for allocation, (_, _, _, indices) in zip(allocations, shards, strict=True)
            for index in indices
        ],
        batch_size=2000,
    )


def build(count: int, gpus: int = 8, shards: int = 4, at: float | None = None) -> list[str]:
    """`count` ready nodes of `gpus` H100s, a local and a shared filesystem, `shards` shards of two GPUs each.

    As many shards as fit, every one running; returns the node ids.
    """
    heartbeat = datetime.fromtimestamp(at, UTC) if at is not None else None
    ids = [node_id(i) for i in range(count)]
    Node.objects.bulk_create(
        Node(
            id=nid,
            hostname=f"{nid}.example",
            os_version="12",
            last_heartbeat=heartbeat,
            **BULK_HOST,
        )
        for nid in ids
    )
    GPU.objects.bulk_create(_gpus(ids, gpus))
    Filesystem.objects.bulk_create(_filesystems(ids, local_free=3 * 2**40, shared_free=2**40, fstype="xfs"))
    per_node = min(shards, gpus // 2) if gpus else shards
    _allocations(
        [
            (nid, shard_id(nid, s), f"r-{nid}-{s}", [2 * s, 2 * s + 1] if gpus else [])
            for nid in ids
            for s in range(per_node)
        ],
        MODEL,
        64,
    )
    return ids


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


# Mostly ready, and every other displayed state: the pages fleet cycles through these.
STATE_MIX = (
    (AdminState.ACTIVE, Liveness.ALIVE),
    (AdminState.ACTIVE, Liveness.ALIVE),
    (AdminState.ACTIVE, Liveness.ALIVE),
    (AdminState.CORDONED, Liveness.ALIVE),
    (AdminState.DRAINING, Liveness.ALIVE),
    (AdminState.ACTIVE, Liveness.UNREACHABLE),
    (AdminState.ACTIVE, Liveness.LOST),
)
PAGE_GPUS = 8


def make_fleet(count: int, prefix: str = "n", with_loads: bool = True, now: float | None = None) -> list[str]:
    """`count` nodes in varied states and racks, each with 8 GPUs, two filesystems, one 4-GPU shard and a load."""
    now = now if now is not None else time.time()
    heartbeat = timezone.now()
    nodes = []
    for i in range(count):
        admin_state, liveness = STATE_MIX[i % len(STATE_MIX)]
        nodes.append(
            Node(
                id=f"{prefix}{i:05d}",
                hostname=f"{prefix}{i:05d}.rack{i % 40}.example",
                labels={"rack": f"r{i % 40}", "zone": "a" if i % 2 else "b"},
                admin_state=admin_state,
                liveness=liveness,
                last_heartbeat=heartbeat - timedelta(seconds=i % 20),
                **BULK_HOST,
            )
        )
    Node.objects.bulk_create(nodes, batch_size=1000)
    ids = [node.pk for node in nodes]
    GPU.objects.bulk_create(_gpus(ids, PAGE_GPUS), batch_size=2000)
    Filesystem.objects.bulk_create(
        _filesystems(ids, local_free=2**40, shared_free=2**42, fstype="ext4"), batch_size=2000
    )
    _allocations([(nid, f"{nid}-s0", f"{nid}-r0", [0, 1, 2, 3]) for nid in ids], "llama-3-70b", 64)
    if with_loads:
        pipe = livestate.client().pipeline(transaction=False)
        for i, nid in enumerate(ids):
            loadstore.save(nid, fleet_load(i, f"{nid}-s0"), now - (i % 10), pipe=pipe)
        pipe.execute()
    return ids


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


def placement_fleet(size: int) -> None:
    """`size` nodes for the placement benchmark: 60 % 8 × H100 on three fabrics, 20 % 4 × A100, 20 % CPU only.

    A few are cordoned, draining, unreachable or lost, spread through the fleet.
    """
    nodes, gpus, fabrics = [], [], []
    for i in range(size):
        nid = node_id(i)
        kind = i % 10
        admin, liveness = AdminState.ACTIVE, Liveness.ALIVE
        if i % 97 == 0:
            admin = AdminState.CORDONED
        elif i % 101 == 0:
            admin = AdminState.DRAINING
        elif i % 103 == 0:
            liveness = Liveness.UNREACHABLE
        elif i % 211 == 0:
            liveness = Liveness.LOST
        nodes.append(
            Node(
                id=nid,
                hostname=f"{nid}.example",
                mgmt_addr=f"10.{i // 65536}.{i // 256 % 256}.{i % 256}",
                memory_total_bytes=(1024 if kind < 6 else 256) * 2**30,
                cpus=192 if kind < 6 else 64,
                admin_state=admin,
                liveness=liveness,
            )
        )
        if kind < 6:
            gpus += _gpus([nid], 8)
            fabrics.append(FabricAttachment(node_id=nid, fabric=f"ib-{i % 3}", hcas=[f"mlx5_{k}" for k in range(4)]))
        elif kind < 8:
            gpus += _gpus([nid], 4, "NVIDIA A100 40GB", 40 * 2**30)
    Node.objects.bulk_create(nodes, batch_size=2000)
    GPU.objects.bulk_create(gpus, batch_size=5000)
    FabricAttachment.objects.bulk_create(fabrics, batch_size=2000)
