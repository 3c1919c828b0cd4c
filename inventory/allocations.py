"""Claiming and releasing a node's GPUs and host memory for shards."""

from __future__ import annotations

from collections.abc import Iterable

from django.db import transaction

from inventory.models import Allocation, FabricAttachment, GPUClaim, Node


def allocate(
    node: Node,
    shard_id: str,
    replica_id: str,
    gpu_indices: Iterable[int],
    memory_gb: int = 0,
    model: str = "",
    cpu_cores: int = 0,
) -> Allocation:
    """Record a shard on a node. The database refuses a GPU already claimed there."""
    with transaction.atomic():
        allocation = Allocation.objects.create(
            node=node, shard_id=shard_id, replica_id=replica_id, memory_gb=memory_gb, model=model, cpu_cores=cpu_cores
        )
        GPUClaim.objects.bulk_create(
            GPUClaim(allocation=allocation, node=node, gpu_index=index) for index in sorted(set(gpu_indices))
        )
    return allocation


def release_shard(shard_id: str) -> int:
    """Free what one shard held. Returns how many allocations were removed."""
    _, deleted = Allocation.objects.filter(shard_id=shard_id).delete()
    return deleted.get(Allocation._meta.label, 0)


def release_replica(replica_id: str) -> int:
    """Free every shard of a replica, on every node.

    Replicas are freed whole because they fail whole: one dead shard makes the
    others useless, and the replica is rebuilt rather than patched.
    """
    _, deleted = Allocation.objects.filter(replica_id=replica_id).delete()
    return deleted.get(Allocation._meta.label, 0)


def cluster_fabrics() -> list[str]:
    """Every fabric any node is attached to, sorted."""
    return sorted(set(FabricAttachment.objects.values_list("fabric", flat=True)))
