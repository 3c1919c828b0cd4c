"""Liveness: heartbeats bring a node back, silence marks it unreachable, then lost.

Every change is a compare-and-set update (`filter(pk=…, liveness=old)`), and
the side effects run only when that update changed a row, so a late or
duplicated sweep does nothing twice. Admin state is never touched here.

An ordinary heartbeat of a live node writes no database row: its time goes into
one Redis hash (`livestate.heartbeats`), and `flush_heartbeats` moves the whole hash
into `Node.last_heartbeat` with a few bulk UPDATEs. The sweep flushes first, so
it never judges a node by a time older than the one Redis holds. Changes of
liveness still go straight to the database (`touch`), as does every heartbeat
while Redis is down.

When most of the fleet is unreachable at once (more than
LLMGW_DISRUPTION_THRESHOLD of the nodes not lost, and at least two), the sweep
marks no node lost: so many nodes falling silent together more likely means
the fault is the control plane's own (slow or restarted) or the network's, and
losing a node releases its replicas, which a heartbeat cannot undo. Marking
nodes unreachable goes on, since it can. (Kubernetes' node lifecycle
controller stops evicting in such a "full disruption" for the same reason.)
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from itertools import islice

import redis
from django.conf import settings
from django.db import connection, transaction
from django.db.models import Count, Q
from django.utils import timezone

from inventory.models import RUN_STATES, Allocation, Liveness, Node, NodeEvent, ReplicaState, Shard
from inventory.replicas import fail_replicas
from livestate import heartbeats
from llmgw_site.logs import OccasionalWarning

log = logging.getLogger(__name__)

FLUSH_BATCH = 500

# One silent node is that node's own fault, whatever the size of the fleet: a
# single-node cluster still loses its node.
MIN_DISRUPTED_NODES = 2
# A sweep holding back is logged at most once a minute per process, not on every sweep.
warn_holding_back = OccasionalWarning(log, 60.0)


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


def flush_heartbeats() -> int:
    """Write the heartbeat times held in Redis to the database in bulk; returns how many.

    The hash is taken and emptied in one transaction, so a heartbeat arriving
    meanwhile lands in a fresh hash for the next flush. If the database refuses
    the write, the times are put back unless a newer one has arrived since.
    """
    raw = heartbeats.take()
    if not raw:
        return 0
    try:
        _write_last_heartbeats(raw)
    except Exception:
        heartbeats.put_back(raw)
        raise
    return len(raw)


def _write_last_heartbeats(raw: dict[bytes, bytes]) -> None:
    times = {}
    for node_id, value in raw.items():
        try:
            times[node_id.decode()] = datetime.fromtimestamp(float(value), UTC)
        except (ValueError, OverflowError, UnicodeDecodeError):
            log.warning("dropping unreadable heartbeat time %r of %r", value, node_id)
    items = iter(sorted(times.items()))
    sql = _bulk_update_sql()
    with connection.cursor() as cursor:
        while batch := list(islice(items, FLUSH_BATCH)):
            rows = ", ".join(["(%s, %s)"] * len(batch))
            params = [part for node_id, at in batch for part in (node_id, connection.ops.adapt_datetimefield_value(at))]
            cursor.execute(sql.format(rows=rows), params)


def _bulk_update_sql() -> str:
    """One UPDATE for a batch of (id, time) rows; PostgreSQL and SQLite (3.33+) both take it.

    Raw SQL because the ORM's equivalent (a CASE with a WHEN per row) costs the
    worker about two seconds of CPU per 10,000 nodes, every five seconds.
    Forward only: `touch` may have written a newer time straight to the row.
    """
    quote = connection.ops.quote_name
    table, pk = quote(Node._meta.db_table), quote(Node._meta.pk.column)
    column = quote(Node._meta.get_field("last_heartbeat").column)
    return (
        f"WITH arrived(id, at) AS (VALUES {{rows}}) "
        f"UPDATE {table} SET {column} = arrived.at FROM arrived "
        f"WHERE {table}.{pk} = arrived.id AND ({table}.{column} IS NULL OR {table}.{column} < arrived.at)"
    )


@dataclass
class SweepResult:
    unreachable: list[str] = field(default_factory=list)
    lost: list[str] = field(default_factory=list)
    released_replicas: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    flushed: int = 0
    # Nodes silent past LLMGW_LOST_AFTER left unreachable because most of the
    # fleet was unreachable at once (0: the sweep did not hold back).
    held: int = 0


def mark_stale(now: datetime | None = None) -> SweepResult:
    """Mark silent nodes unreachable, and long-silent ones lost unless most of the fleet is unreachable.

    Heartbeat times held in Redis are flushed first. A node becoming lost has
    every replica with a shard on it released whole, since a replica fails
    whole. One node raising does not stop the rest; Redis being down stops
    nothing either (heartbeats then go to the database directly).
    """
    now = now or timezone.now()
    result = SweepResult()
    try:
        result.flushed = flush_heartbeats()
    except redis.RedisError as exc:
        log.warning("sweeping without flushing heartbeat times, Redis is unavailable: %s", exc)
    _sweep(now, result)
    return result


def _sweep(now: datetime, result: SweepResult) -> None:
    _mark_unreachable(now, result)
    gone = _silent_past_lost(now)
    if not gone:
        return
    # Counted after the unreachable marking: nodes falling silent together in
    # this sweep count as well as those unreachable before.
    unreachable, present = _unreachable_and_present()
    if disrupted(unreachable, present):
        result.held = len(gone)
        _warn_holding_back(len(gone), unreachable, present)
        return
    _mark_lost(gone, now, result)


def _mark_unreachable(now: datetime, result: SweepResult) -> None:
    unreachable_before = now - timedelta(seconds=settings.LLMGW_UNREACHABLE_AFTER)
    silent = Node.objects.filter(liveness=Liveness.ALIVE, last_heartbeat__lt=unreachable_before)
    for node_id in silent.values_list("pk", flat=True):
        try:
            reason = f"no heartbeat for {settings.LLMGW_UNREACHABLE_AFTER:g} s"
            if change_liveness(node_id, Liveness.ALIVE, Liveness.UNREACHABLE, reason, now):
                result.unreachable.append(node_id)
        except Exception:
            log.exception("marking node %s unreachable failed", node_id)
            result.failed.append(node_id)


def _silent_past_lost(now: datetime) -> list[str]:
    lost_before = now - timedelta(seconds=settings.LLMGW_LOST_AFTER)
    gone = Node.objects.filter(liveness=Liveness.UNREACHABLE, last_heartbeat__lt=lost_before)
    return list(gone.values_list("pk", flat=True))


def _mark_lost(node_ids: list[str], now: datetime, result: SweepResult) -> None:
    for node_id in node_ids:
        try:
            reason = f"no heartbeat for {settings.LLMGW_LOST_AFTER:g} s"
            with transaction.atomic():
                if change_liveness(node_id, Liveness.UNREACHABLE, Liveness.LOST, reason, now):
                    result.lost.append(node_id)
                    result.released_replicas += release_replicas_on(node_id, now)
        except Exception:
            log.exception("marking node %s lost failed", node_id)
            result.failed.append(node_id)


def disrupted(unreachable: int, present: int) -> bool:
    """Whether so much of the fleet is unreachable that the fault is more likely not the nodes'.

    `present` counts every node not lost, `unreachable` those of them unreachable.
    """
    return unreachable >= MIN_DISRUPTED_NODES and unreachable > settings.LLMGW_DISRUPTION_THRESHOLD * present


def _unreachable_and_present() -> tuple[int, int]:
    counts = Node.objects.exclude(liveness=Liveness.LOST).aggregate(
        present=Count("pk"), unreachable=Count("pk", filter=Q(liveness=Liveness.UNREACHABLE))
    )
    return counts["unreachable"], counts["present"]


def _warn_holding_back(held: int, unreachable: int, present: int) -> None:
    warn_holding_back(
        "%d of %d nodes are unreachable (more than LLMGW_DISRUPTION_THRESHOLD=%g): none of the %d silent past "
        "LLMGW_LOST_AFTER is marked lost, since the fault is more likely the control plane's or the network's; "
        "they will be once fewer nodes are unreachable",
        unreachable,
        present,
        settings.LLMGW_DISRUPTION_THRESHOLD,
        held,
    )


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
