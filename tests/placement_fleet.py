"""Building nodes and deployments for the placement and reconcile tests."""

from __future__ import annotations

from datetime import timedelta

from django.utils import timezone

from agent import protocol
from inventory.models import AdminState, Deployment, Engine, Liveness, Node
from inventory.registration import upsert_inventory
from tests.conftest import make_inventory


def node(
    name: str,
    gpus: int = 8,
    gpu_name: str = "NVIDIA H100 80GB HBM3",
    memory_gb: int = 512,
    cpus: int = 192,
    fabrics: dict[str, list[str]] | None = None,
    weights: list[str] | None = None,
    admin_state: str = AdminState.ACTIVE,
    liveness: str = Liveness.ALIVE,
) -> Node:
    """A node as its agent would report it, then put in the state asked for."""
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
    now = timezone.now()
    created, _ = upsert_inventory(name, inventory, now=now)
    age = {Liveness.ALIVE: 1, Liveness.UNREACHABLE: 60, Liveness.LOST: 600}[liveness]
    Node.objects.filter(pk=name).update(
        admin_state=admin_state, liveness=liveness, last_heartbeat=now - timedelta(seconds=age)
    )
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
