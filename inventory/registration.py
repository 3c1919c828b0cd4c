"""Recording what an agent says its node is, without undoing an operator's decisions."""

from __future__ import annotations

import ipaddress
from datetime import datetime

from django.db import transaction
from django.utils import timezone

from agent import protocol
from inventory.events import record_folding_repeats
from inventory.models import (
    AGENT_FIELDS,
    GPU,
    EngineInstall,
    FabricAttachment,
    Filesystem,
    Node,
    NodeEvent,
    Weights,
    gpu_class,
)
from inventory.replicas import fail_gpu_holders


class ReplayedInventory(Exception):
    """The inventory came with a heartbeat no newer than the one the stored inventory came with."""

    def __init__(self, boot_id: str, seq: int, stored_seq: int):
        super().__init__(f"heartbeat {seq} of run {boot_id} is not newer than {stored_seq}, already received")
        self.stored_seq = stored_seq


def as_ip(address: str) -> str | None:
    """The client address if it is an IP address, in its canonical form; else None.

    A proxy may forward something else ("unknown", a name); nothing but an
    address the control plane saw is recorded as where a node is.
    """
    try:
        return str(ipaddress.ip_address(address))
    except ValueError:
        return None


def upsert_inventory(
    node_id: str,
    inventory: protocol.Inventory,
    inventory_hash: str = "",
    now: datetime | None = None,
    boot_id: str = "",
    seq: int = 0,
    source_addr: str | None = None,
) -> tuple[Node, bool]:
    """Create or update a node from its agent's report, in one transaction.

    The node's hardware rows are replaced whole, but for a GPU still there
    with the same uuid, which keeps its condition (a failed GPU stays failed
    through a re-registration); its admin state, notes and liveness are left
    alone, so an agent re-registering never clears a cordon or a drain. A
    replica that held a GPU the report no longer lists fails whole and frees
    its claims, so placement rebuilds it elsewhere and the GPU, should it come
    back, comes back free. Returns the node and whether it was created.

    `boot_id` and `seq` say which heartbeat of which agent run the inventory came
    with: one no newer than the stored inventory's, from the same run, raises
    ReplayedInventory and changes nothing (the beat script refuses most such
    heartbeats first; this holds while Redis is down and when two race).
    `source_addr`, the client address the report came from, is recorded when given.
    """
    now = now or timezone.now()
    host = inventory.host
    # Exactly the agent's fields (AGENT_FIELDS): an operator's never appear here.
    values = {
        "hostname": inventory.hostname,
        "mgmt_addr": inventory.mgmt_addr,
        "memory_total_bytes": inventory.memory_total_bytes or None,
        "os": host.os,
        "os_version": host.os_version,
        "kernel": host.kernel,
        "arch": host.arch,
        "cpu_model": host.cpu_model,
        "cpus": host.cpus,
        "agent_version": inventory.agent_version,
        "engine_versions": dict(inventory.engine_versions),
        "engines_probed": inventory.engines_probed,
        "weights_scanned": inventory.weights_scanned,
        "inventory_hash": inventory_hash,
        "labels": dict(inventory.labels),
        "inventory_boot_id": boot_id,
        "inventory_seq": seq,
    }
    fields = list(AGENT_FIELDS)
    if source_addr is not None:
        values["source_addr"] = source_addr
        fields.append("source_addr")
    with transaction.atomic():
        node = Node.objects.select_for_update().filter(pk=node_id).first()
        created = node is None
        if created:
            node = Node(id=node_id, registered_at=now, last_heartbeat=now, **values)
            node.save(force_insert=True)
        else:
            if boot_id and node.inventory_boot_id == boot_id and seq <= node.inventory_seq:
                raise ReplayedInventory(boot_id, seq, node.inventory_seq)
            for field in fields:
                setattr(node, field, values[field])
            node.save(update_fields=fields)
        dropped = _replace_hardware(node, inventory, created)
        if dropped:
            fail_gpu_holders([(node.pk, index) for index in dropped], "left its node's inventory", now)
    return node, created


# The GPU fields its agent owns; the condition fields are the control plane's.
GPU_AGENT_FIELDS = ("name", "gpu_class", "memory_bytes", "ecc_errors", "health")


def _replace_gpus(node: Node, reported: list[protocol.GPU], created: bool) -> list[int]:
    """Update the GPUs still there (same index and uuid), replace the rest; returns the indices of those gone.

    A GPU is gone when its index is no longer listed or lists another uuid (another card).
    A node just created has none yet: nothing is read or deleted.
    """
    stored = [] if created else GPU.objects.filter(node=node).values_list("pk", "index", "uuid")
    kept = {(index, uuid): pk for pk, index, uuid in stored}
    rows = [
        GPU(
            pk=kept.pop((gpu.index, gpu.uuid), None),
            node=node,
            index=gpu.index,
            uuid=gpu.uuid,
            name=gpu.name,
            gpu_class=gpu_class(gpu.name, gpu.memory_bytes),
            memory_bytes=gpu.memory_bytes,
            ecc_errors=gpu.ecc_errors,
            health=gpu.health,
        )
        for gpu in _unique_by(reported, lambda gpu: gpu.index)
    ]
    # What is left in `kept` is gone or another card now: deleted first, as its index may be taken again.
    if kept:
        GPU.objects.filter(pk__in=kept.values()).delete()
    GPU.objects.bulk_update([row for row in rows if row.pk is not None], GPU_AGENT_FIELDS)
    GPU.objects.bulk_create([row for row in rows if row.pk is None])
    return sorted(index for index, _ in kept)


def _replace_hardware(node: Node, inventory: protocol.Inventory, created: bool) -> list[int]:
    """Write the node's hardware rows; returns the indices of GPUs gone from it.

    A node just created has no rows to read or delete: a fleet's bootstrap
    then costs one INSERT per table (bench/registration.py).
    """
    dropped = _replace_gpus(node, inventory.gpus, created)
    _record_install_changes(node, inventory.provision, created)
    if not created:
        for model in (Filesystem, Weights, FabricAttachment, EngineInstall):
            model.objects.filter(node=node).delete()
    # The tables whose rows copy the report field for field, each report deduplicated where the table is unique.
    copied = (
        (
            Filesystem,
            _unique_by(inventory.filesystems, lambda fs: fs.mount),
            ("mount", "fstype", "total_bytes", "free_bytes", "shared"),
        ),
        (Weights, _unique_by(inventory.weights, lambda w: w.path), ("path", "size_bytes", "format")),
        (EngineInstall, inventory.provision, ("engine", "version", "variant", "state", "detail")),
    )
    for model, reported, fields in copied:
        model.objects.bulk_create(
            model(node=node, **{name: getattr(item, name) for name in fields}) for item in reported
        )
    FabricAttachment.objects.bulk_create(
        FabricAttachment(node=node, fabric=f.name, hcas=list(f.hcas), rate_gbps=f.rate_gbps)
        for f in _unique_by(inventory.fabrics, lambda f: f.name)
    )
    return dropped


def _record_install_changes(node: Node, reported: list[protocol.EngineInstall], created: bool) -> None:
    """An INSTALL event for each engine install whose state differs from the stored one, repeats folded.

    Read before the rows are replaced; an install first seen counts as a change
    from nothing, and one the report no longer lists is not an event.
    """
    rows = [] if created else EngineInstall.objects.filter(node=node).values_list("engine", "variant", "state")
    stored = {(engine, variant): state for engine, variant, state in rows}
    events = []
    for item in reported:
        # Keyed without the version, which an agent often learns only once the install is done.
        before = stored.get((item.engine, item.variant), "")
        if item.state == before:
            continue
        name = " ".join(word for word in (item.engine, item.version, item.variant) if word)
        lines = item.detail.strip().splitlines()
        reason = f"{name}: {lines[-1]}" if lines else name
        events.append(
            NodeEvent(
                node=node,
                kind=NodeEvent.Kind.INSTALL,
                from_state=before,
                to_state=item.state,
                reason=reason,
                subject=f"{item.engine} {item.variant}".strip(),
            )
        )
    if created:
        # A new node has nothing to fold into: one INSERT.
        NodeEvent.objects.bulk_create(events)
    else:
        # An install that flaps folds into one event: the cost of a flapping node stays flat (issue 22).
        record_folding_repeats(node.pk, events)


def _unique_by(items, key):
    """Keep the last of items sharing a key: the database allows one of each."""
    return list({key(item): item for item in items}.values())


def record_registration(node: Node, created: bool, actor: str = "agent") -> None:
    NodeEvent.objects.create(
        node=node,
        kind=NodeEvent.Kind.REGISTRATION,
        to_state=node.state,
        reason="registered" if created else "re-registered; token rotated",
        actor=actor,
    )
