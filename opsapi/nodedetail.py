"""One node, whole: inventory, current load, engines, GPUs, allocations, drain progress, last events."""

from __future__ import annotations

from django.db.models import Prefetch

from inventory.models import (
    GPU,
    RUN_STATES,
    AdminState,
    Allocation,
    EngineInstall,
    FabricAttachment,
    Filesystem,
    GPUClaim,
    Node,
    NodeEvent,
    ReplicaState,
    Shard,
)
from nodes.loads import fetch_readings, heartbeat_age
from opsapi.nodelist import load_fields

EVENTS_SHOWN = 20
# What still holds a node that is draining, as the reconciler decides it is done.
HOLDING = (*RUN_STATES, ReplicaState.RELEASING)


def find(node_id: str) -> Node | None:
    if "\x00" in node_id:
        return None
    # Each related list in its own order: the models' default orders begin with the
    # node, which makes the database join the node table for every one of them.
    return (
        Node.objects.prefetch_related(
            Prefetch("gpus", GPU.objects.order_by("index")),
            Prefetch("filesystems", Filesystem.objects.order_by("mount")),
            Prefetch("fabrics", FabricAttachment.objects.order_by("fabric")),
            Prefetch("engine_installs", EngineInstall.objects.order_by("engine")),
            Prefetch("allocations", Allocation.objects.order_by("shard_id")),
            Prefetch("allocations__gpu_claims", GPUClaim.objects.order_by("gpu_index")),
        )
        .filter(pk=node_id)
        .first()
    )


def event_fields(event: NodeEvent) -> dict:
    return {
        "id": event.pk,
        "node": event.node_id,
        "at": event.at,
        "kind": event.kind,
        "from_state": event.from_state,
        "to_state": event.to_state,
        "reason": event.reason,
        "actor": event.actor,
        "repeats": event.repeats,
        "last_at": event.last_at,
    }


def drain_progress(node_ids: list[str]) -> dict[str, dict]:
    """For each node: how many replicas and shards still hold something on it, and whether it is drained.

    Three queries for any number of nodes. A node is drained once it is
    cordoned with nothing left, which is what the reconciler makes of a
    draining node.
    """
    nodes = Node.objects.filter(pk__in=node_ids).only("pk", "admin_state", "liveness")
    return progress_of(
        list(nodes), set(Allocation.objects.filter(node_id__in=node_ids).order_by().values_list("node_id", flat=True))
    )


def progress_of(nodes: list[Node], allocated: set[str], shards: list[tuple[str, str, int]] | None = None) -> dict:
    """Drain progress from the nodes' shards as (node id, state, replica pk), read here unless given."""
    if shards is None:
        shards = list(
            Shard.objects.filter(node_id__in=[n.pk for n in nodes], state__in=HOLDING)
            .order_by()
            .values_list("node_id", "state", "replica_id")
        )
    holding: dict[str, list[int]] = {}
    for node_id, state, replica in shards:
        if state in HOLDING:
            holding.setdefault(node_id, []).append(replica)
    progress = {}
    for node in nodes:
        held = holding.get(node.pk, [])
        replicas = len(set(held))
        progress[node.pk] = {
            "node": node.pk,
            "admin_state": node.admin_state,
            "state": node.state,
            "replicas_left": replicas,
            "shards_left": len(held),
            "drained": node.admin_state == AdminState.CORDONED and not replicas and node.pk not in allocated,
        }
    return progress


def drain_of(node: Node, allocations: list[Allocation], shards: list[tuple[str, str, int]]) -> dict | None:
    """The node's drain progress while it drains; None otherwise, as an active node's replicas are not
    "left to move" and a cordoned one's drain is over (`/nodes/{id}/drain/` still answers for any node)."""
    if node.admin_state != AdminState.DRAINING:
        return None
    held = [(node.pk, state, replica) for _, state, replica in shards]
    return progress_of([node], {node.pk} if allocations else set(), held)[node.pk]


def node_detail(node: Node, now: float) -> dict:
    readings, problem = fetch_readings([node.pk], now)
    reading = readings[node.pk]
    allocations = list(node.allocations.all())
    holders = {claim.gpu_index: a.shard_id for a in allocations for claim in a.gpu_claims.all()}
    # No ordering: the model's default joins the replica table for nothing.
    shards = list(Shard.objects.filter(node=node).order_by().values_list("shard_id", "state", "replica_id"))
    states = {shard_id: state for shard_id, state, _ in shards}
    loaded = load_fields(reading)
    if loaded["load"] is not None and reading.load is not None:
        loaded["load"]["shards"] = [
            {"shard": s.shard, "cpu_cores": s.cpu_cores, "rss_bytes": s.rss_bytes} for s in reading.load.shards
        ]
    return {
        "id": node.pk,
        "hostname": node.hostname,
        "mgmt_addr": node.mgmt_addr,
        "address": node.address,
        "state": node.state,
        "admin_state": node.admin_state,
        "admin_state_by": node.admin_state_by,
        "admin_state_at": node.admin_state_at,
        "admin_state_reason": node.admin_state_reason,
        "liveness": node.liveness,
        "schedulable": node.schedulable,
        "labels": node.all_labels,
        "notes": node.notes,
        "os": node.os,
        "os_version": node.os_version,
        "kernel": node.kernel,
        "arch": node.arch,
        "cpu_model": node.cpu_model,
        "cpus": node.cpus,
        "memory_total_bytes": node.memory_total_bytes,
        "agent_version": node.agent_version,
        "engine_versions": node.engine_versions,
        "engines_probed": node.engines_probed,
        "engine_installs": [
            {"engine": e.engine, "version": e.version, "state": e.state, "detail": e.detail}
            for e in node.engine_installs.all()
        ],
        "registered_at": node.registered_at,
        "last_heartbeat": node.last_heartbeat,
        "heartbeat_age_seconds": heartbeat_age(node.last_heartbeat, reading, now),
        **loaded,
        "load_problem": problem,
        "gpus": [
            {
                "index": gpu.index,
                "uuid": gpu.uuid,
                "name": gpu.name,
                "gpu_class": gpu.gpu_class,
                "memory_bytes": gpu.memory_bytes,
                "ecc_errors": gpu.ecc_errors,
                "health": gpu.health,
                "held_by": holders.get(gpu.index),
            }
            for gpu in node.gpus.all()
        ],
        "filesystems": [
            {
                "mount": fs.mount,
                "fstype": fs.fstype,
                "free_bytes": fs.free_bytes,
                "total_bytes": fs.total_bytes,
                "shared": fs.shared,
            }
            for fs in node.filesystems.all()
        ],
        "fabrics": [{"fabric": f.fabric, "hcas": f.hcas, "rate_gbps": f.rate_gbps} for f in node.fabrics.all()],
        "allocations": [
            {
                "shard": a.shard_id,
                "replica": a.replica_id,
                "model": a.model,
                "gpus": a.gpu_indices,
                "memory_gb": a.memory_gb,
                "cpu_cores": a.cpu_cores,
                "state": states.get(a.shard_id),
            }
            for a in allocations
        ],
        "drain": drain_of(node, allocations, shards),
        "events": [event_fields(e) for e in node.events.all()[:EVENTS_SHOWN]],
    }
