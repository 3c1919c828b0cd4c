"""Liveness: heartbeats bring a node back, silence marks it unreachable, then lost.

Every change is a compare-and-set update (`filter(pk=…, liveness=old)`), and
the side effects run only when that update changed a row, so a late or
duplicated sweep does nothing twice. Admin state is never touched here.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from inventory.models import RUN_STATES, Allocation, Liveness, Node, NodeEvent, ReplicaState, Shard
from inventory.replicas import fail_replicas

log = logging.getLogger(__name__)


def change_liveness(node_id: str, old: str, new: str, reason: str, at: datetime) -> bool:
    """Move a node from `old` to `new` liveness if it is still `old`; record it."""
    with transaction.atomic():
        changed = Node.objects.filter(pk=node_id, liveness=old).update(liveness=new)
        if changed:
            NodeEvent.objects.create(
                node_id=node_id,
                at=at,
                kind=NodeEvent.Kind.LIVENESS,
                from_state=old,
                to_state=new,
                reason=reason,
                actor="system",
            )
    return bool(changed)


def touch(node: Node, now: datetime | None = None) -> Node:
    """Record a heartbeat: an unreachable or lost node becomes alive at once."""
    now = now or timezone.now()
    Node.objects.filter(pk=node.pk).update(last_heartbeat=now)
    node.last_heartbeat = now
    if node.liveness != Liveness.ALIVE:
        change_liveness(node.pk, node.liveness, Liveness.ALIVE, "heartbeat received", now)
        node.liveness = Liveness.ALIVE
    return node


@dataclass
class SweepResult:
    unreachable: list[str] = field(default_factory=list)
    lost: list[str] = field(default_factory=list)
    released_replicas: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)


def mark_stale(now: datetime | None = None) -> SweepResult:
    """Mark silent nodes unreachable, and long-silent ones lost.

    A node becoming lost has every replica with a shard on it released whole,
    since a replica fails whole. One node raising does not stop the rest.
    """
    now = now or timezone.now()
    unreachable_before = now - timedelta(seconds=settings.LLMGW_UNREACHABLE_AFTER)
    lost_before = now - timedelta(seconds=settings.LLMGW_LOST_AFTER)
    result = SweepResult()

    silent = Node.objects.filter(liveness=Liveness.ALIVE, last_heartbeat__lt=unreachable_before)
    for node_id in silent.values_list("pk", flat=True):
        try:
            reason = f"no heartbeat for {settings.LLMGW_UNREACHABLE_AFTER:g} s"
            if change_liveness(node_id, Liveness.ALIVE, Liveness.UNREACHABLE, reason, now):
                result.unreachable.append(node_id)
        except Exception:
            log.exception("marking node %s unreachable failed", node_id)
            result.failed.append(node_id)

    gone = Node.objects.filter(liveness=Liveness.UNREACHABLE, last_heartbeat__lt=lost_before)
    for node_id in gone.values_list("pk", flat=True):
        try:
            reason = f"no heartbeat for {settings.LLMGW_LOST_AFTER:g} s"
            with transaction.atomic():
                if change_liveness(node_id, Liveness.UNREACHABLE, Liveness.LOST, reason, now):
                    result.lost.append(node_id)
                    result.released_replicas += release_replicas_on(node_id, now)
        except Exception:
            log.exception("marking node %s lost failed", node_id)
            result.failed.append(node_id)
    return result


def release_replicas_on(node_id: str, now: datetime | None = None) -> list[str]:
    """Release, whole, every replica that has a shard on the node, and mark it failed.

    The reconciler then builds a new replica elsewhere to take its place.
    """
    holding = Allocation.objects.filter(node_id=node_id).values_list("replica_id", flat=True)
    running = Shard.objects.filter(node_id=node_id, state__in=(*RUN_STATES, ReplicaState.RELEASING)).values_list(
        "replica__replica_id", flat=True
    )
    replica_ids = sorted(set(holding) | set(running))
    fail_replicas(replica_ids, f"node {node_id} lost", now)
    return replica_ids
