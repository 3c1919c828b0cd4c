"""Deployments as the API shows them, read in a fixed number of queries whatever their size."""

from __future__ import annotations

from django.db.models import Prefetch, QuerySet

from inventory.fleet import Profile
from inventory.models import Deployment, Replica, ReplicaState, Shard


def deployments() -> QuerySet:
    replicas = Replica.objects.select_related("replaces").prefetch_related(
        Prefetch("shards", queryset=Shard.objects.order_by("index"))
    )
    return Deployment.objects.order_by("name").prefetch_related(
        Prefetch("replica_set", queryset=replicas.order_by("ordinal"))
    )


def deployment_fields(deployment: Deployment, may_change: bool) -> dict:
    """What the API shows of a deployment; secret arguments only to a caller who may change it."""
    replicas = list(deployment.replica_set.all())
    return {
        "name": deployment.name,
        "served_model_name": deployment.served_model_name,
        "prefix_affinity": deployment.prefix_affinity,
        "max_in_flight_per_replica": deployment.max_in_flight_per_replica,
        "model_source": deployment.model_source,
        "engine": deployment.engine,
        "arguments": deployment.arguments_for(may_change),
        "secret_arguments": deployment.secret_arguments,
        "replicas_wanted": deployment.replicas,
        "replicas_running": sum(r.state == ReplicaState.RUNNING for r in replicas),
        "shards_per_replica": deployment.shards_per_replica,
        "gpus_per_shard": deployment.gpus_per_shard,
        "gpu_class": deployment.gpu_class,
        "memory_gb_per_shard": deployment.memory_gb_per_shard,
        "cpu_cores_per_shard": deployment.cpu_cores_per_shard,
        "profile": Profile.of(deployment).describe(),
        "created_at": deployment.created_at,
        "not_placed": [
            {"replica": r.replica_id, "reason": r.reason} for r in replicas if r.state == ReplicaState.PENDING
        ],
        "replicas": [
            {
                "replica_id": r.replica_id,
                "ordinal": r.ordinal,
                "state": r.state,
                "reason": r.reason,
                "changed_at": r.changed_at,
                "fabric": r.fabric,
                "replaces": r.replaces.replica_id if r.replaces else None,
                "shards": [
                    {
                        "shard_id": s.shard_id,
                        "index": s.index,
                        "node": s.node_id,
                        "state": s.state,
                        "reason": s.reason,
                        "gpus": s.gpu_indices,
                        "port": s.port,
                    }
                    for s in r.shards.all()
                ],
            }
            for r in replicas
        ],
    }
