"""Liveness: heartbeats bring a node back, silence marks it unreachable, then lost.

Every change is a compare-and-set update (`filter(pk=…, liveness=old)`), and
the side effects run only when that update changed a row, so a late or
duplicated sweep does nothing twice. Admin state is never touched here.

A heartbeat writes no database row while Redis is up, whatever the node's
liveness: its time goes into one Redis hash (`livestate.heartbeats`), and
`flush` moves the whole hash into `Node.last_heartbeat` with a few
bulk UPDATEs, and brings back to life, in bulk, every unreachable or lost node
found in it. The sweep flushes first, so it never judges a node by a time older
than the one Redis holds. Only while Redis is down does a heartbeat go to the
database directly (`touch`), and revive its node there.

Changes of many nodes at once (revivals, unreachable marking) are one
compare-and-set UPDATE per batch of ids (`... WHERE liveness = old RETURNING id`)
and one INSERT of their events, all batches in one transaction. Neither leaves
the nodes' cached cards stale, nor does any change of liveness: a heartbeat
answers its node as alive whatever its card says (`inventory.heartbeat`), so a
fleet coming back after a partition stays on the heartbeat's cheap path. A
batch that raises is undone alone (a savepoint) and done again node by node, so
one bad row cannot stop the others.

When most of the fleet is unreachable at once (more than
LLMGW_DISRUPTION_THRESHOLD of the nodes not lost, and at least two), the sweep
marks no node lost: so many nodes falling silent together more likely means
the fault is the control plane's own (slow or restarted) or the network's, and
losing a node releases its replicas, which a heartbeat cannot undo. Marking
nodes unreachable goes on, since it can. (Kubernetes' node lifecycle
controller stops evicting in such a "full disruption" for the same reason.)
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from itertools import islice

import redis
from django.conf import settings
from django.db import connection, transaction
from django.db.models import Count, Q
from django.utils import timezone

from inventory.events import change_and_record
from inventory.models import RUN_STATES, Allocation, Liveness, Node, NodeEvent, ReplicaState, Shard
from inventory.replicas import fail_replicas
from lib.logs import OccasionalWarning
from livestate import heartbeats

log = logging.getLogger(__name__)

FLUSH_BATCH = 500

# One silent node is that node's own fault, whatever the size of the fleet: a
# single-node cluster still loses its node.
MIN_DISRUPTED_NODES = 2
# A sweep holding back is logged at most once a minute per process, not on every sweep.
warn_holding_back = OccasionalWarning(log, 60.0)


def change_liveness(node_id: str, old: str, new: str, reason: str, at: datetime) -> bool:
    """Move a node from `old` to `new` liveness if it is still `old`; record it."""
    return change_and_record(
        Node.objects.filter(pk=node_id, liveness=old),
        {"liveness": new},
        NodeEvent(
            node_id=node_id,
            at=at,
            kind=NodeEvent.Kind.LIVENESS,
            from_state=old,
            to_state=new,
            reason=reason,
            actor="system",
        ),
    )


def touch(node: Node, now: datetime | None = None) -> Node:
    """Record a heartbeat: an unreachable or lost node becomes alive at once."""
    now = now or timezone.now()
    Node.objects.filter(pk=node.pk).update(last_heartbeat=now)
    node.last_heartbeat = now
    if node.liveness != Liveness.ALIVE:
        change_liveness(node.pk, node.liveness, Liveness.ALIVE, "heartbeat received", now)
        node.liveness = Liveness.ALIVE
    return node


def flush(now: datetime | None = None) -> Flushed:
    """Write the heartbeat times held in Redis to the database in bulk, and revive the nodes among them.

    The hash is taken and emptied in one transaction, so a heartbeat arriving
    meanwhile lands in a fresh hash for the next flush. If the database refuses
    the write, the times are put back unless a newer one has arrived since.
    """
    raw = heartbeats.take()
    if not raw:
        return Flushed()
    try:
        times = _read_times(raw)
        _write_last_heartbeats(times)
        revived = _revive(times, now or timezone.now())
    except Exception:
        heartbeats.put_back(raw)
        raise
    return Flushed(len(raw), revived)


@dataclass
class Flushed:
    """What a flush did: how many heartbeat times it wrote, and which nodes it brought back to life."""

    times: int = 0
    revived: list[str] = field(default_factory=list)


def _read_times(raw: dict[bytes, bytes]) -> dict[str, datetime]:
    times = {}
    for node_id, value in raw.items():
        try:
            times[node_id.decode()] = datetime.fromtimestamp(float(value), UTC)
        except (ValueError, OverflowError, UnicodeDecodeError):
            log.warning("dropping unreadable heartbeat time %r of %r", value, node_id)
    return times


def _write_last_heartbeats(times: dict[str, datetime]) -> None:
    """Store each node's time, forward only: `touch` may have written a newer one straight to the row."""
    # One transaction, so one commit (a WAL flush on PostgreSQL) rather than one per batch.
    with transaction.atomic(), connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            rows = json.dumps({node_id: at.isoformat() for node_id, at in times.items()})
            cursor.execute(_update_from_json_sql(), [rows])
            return
        items = iter(sorted(times.items()))
        sql = _update_from_values_sql()
        while batch := list(islice(items, FLUSH_BATCH)):
            rows = ", ".join(["(%s, %s)"] * len(batch))
            params = [part for node_id, at in batch for part in (node_id, connection.ops.adapt_datetimefield_value(at))]
            cursor.execute(sql.format(rows=rows), params)


def _update_from_json_sql() -> str:
    """PostgreSQL: one UPDATE for the whole flush, its rows in one JSON parameter.

    psycopg binds parameters in Python, so 20,000 of them (the batches of
    VALUES below) cost the worker about 100 ms of CPU per 10,000 nodes; one
    JSON document costs it a few.
    """
    table, pk, column = _node_heartbeat_names()
    return (
        f"UPDATE {table} SET {column} = arrived.at::timestamptz "
        f"FROM jsonb_each_text(%s::jsonb) AS arrived(id, at) "
        f"WHERE {table}.{pk} = arrived.id AND ({table}.{column} IS NULL OR {table}.{column} < arrived.at::timestamptz)"
    )


def _update_from_values_sql() -> str:
    """SQLite (3.33+): one UPDATE for a batch of (id, time) rows.

    Raw SQL because the ORM's equivalent (a CASE with a WHEN per row) costs the
    worker about two seconds of CPU per 10,000 nodes, every five seconds.
    """
    table, pk, column = _node_heartbeat_names()
    return (
        f"WITH arrived(id, at) AS (VALUES {{rows}}) "
        f"UPDATE {table} SET {column} = arrived.at FROM arrived "
        f"WHERE {table}.{pk} = arrived.id AND ({table}.{column} IS NULL OR {table}.{column} < arrived.at)"
    )


def _node_heartbeat_names() -> tuple[str, str, str]:
    quote = connection.ops.quote_name
    return (
        quote(Node._meta.db_table),
        quote(Node._meta.pk.column),
        quote(Node._meta.get_field("last_heartbeat").column),
    )


def _revive(times: dict[str, datetime], now: datetime) -> list[str]:
    """Bring back to life every unreachable or lost node that has a heartbeat among `times`.

    One read finds the nodes not alive (few, except after an outage); only
    those of them with a heartbeat are changed, by old liveness, in batches.
    The event is dated `now`, when the database learns of it, which is never
    before the event that made the node unreachable.
    """
    down = Node.objects.exclude(liveness=Liveness.ALIVE).values_list("pk", "liveness")
    by_liveness: dict[str, list[str]] = {}
    for node_id, old in down:
        if node_id in times:
            by_liveness.setdefault(old, []).append(node_id)
    revived = []
    for old, node_ids in sorted(by_liveness.items()):
        revived += change_in_bulk(sorted(node_ids), old, Liveness.ALIVE, "heartbeat received", now).changed
    return revived


def change_in_bulk(node_ids: list[str], old: str, new: str, reason: str, at: datetime) -> Changed:
    """`change_liveness` for many nodes: those still `old` move to `new`.

    One UPDATE and one insert of events per batch of FLUSH_BATCH ids. A batch
    that raises is done again node by node, so one bad row cannot stop the
    others; a node that still raises is logged, left as it was and named in
    `failed`.
    """
    result = Changed()
    ids = iter(node_ids)
    # One commit for all the batches (a WAL flush each on PostgreSQL, which
    # was most of a 10,000-node sweep's time); each batch is a savepoint, so
    # one that fails is undone alone and done again node by node.
    with transaction.atomic():
        while batch := list(islice(ids, FLUSH_BATCH)):
            try:
                result.changed += _change_batch(batch, old, new, reason, at)
            except Exception:
                log.exception("changing %d nodes from %s to %s at once failed; one by one", len(batch), old, new)
                _change_one_by_one(batch, old, new, reason, at, result)
    return result


@dataclass
class Changed:
    changed: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)


def _change_batch(node_ids: list[str], old: str, new: str, reason: str, at: datetime) -> list[str]:
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(_compare_and_set_sql(len(node_ids)), [new, old, *node_ids])
        changed = sorted(row[0] for row in cursor.fetchall())
        if changed:
            at_value = connection.ops.adapt_datetimefield_value(at)
            params = [at_value, NodeEvent.Kind.LIVENESS.value, old, new, reason, "system", *changed]
            cursor.execute(_events_sql(len(changed)), params)
    return changed


def _compare_and_set_sql(count: int) -> str:
    """Move the rows of `count` ids from one liveness to another; the ids of those that moved come back.

    PostgreSQL and SQLite (3.35+) both take RETURNING.
    """
    quote = connection.ops.quote_name
    table, pk = quote(Node._meta.db_table), quote(Node._meta.pk.column)
    column = quote(Node._meta.get_field("liveness").column)
    marks = ", ".join(["%s"] * count)
    return f"UPDATE {table} SET {column} = %s WHERE {column} = %s AND {pk} IN ({marks}) RETURNING {pk}"


def _events_sql(count: int) -> str:
    """One liveness event for each of `count` node ids, the same but for the node, in one statement.

    INSERT … SELECT rather than `bulk_create`: the ORM prepares every field of
    every row in Python, which was two thirds of the sweep's CPU at 10,000
    nodes (bench/sweep.py); here the database copies six constants.
    """
    quote = connection.ops.quote_name
    node_table, pk = quote(Node._meta.db_table), quote(Node._meta.pk.column)
    columns = ", ".join(
        quote(NodeEvent._meta.get_field(name).column)
        for name in ("node", "at", "kind", "from_state", "to_state", "reason", "actor")
    )
    marks = ", ".join(["%s"] * count)
    return (
        f"INSERT INTO {quote(NodeEvent._meta.db_table)} ({columns}) "
        f"SELECT {pk}, %s, %s, %s, %s, %s, %s FROM {node_table} WHERE {pk} IN ({marks})"
    )


def _change_one_by_one(node_ids: list[str], old: str, new: str, reason: str, at: datetime, result: Changed) -> None:
    for node_id in node_ids:
        try:
            if change_liveness(node_id, old, new, reason, at):
                result.changed.append(node_id)
        except Exception:
            log.exception("changing node %s from %s to %s failed", node_id, old, new)
            result.failed.append(node_id)


@dataclass
class SweepResult:
    unreachable: list[str] = field(default_factory=list)
    lost: list[str] = field(default_factory=list)
    released_replicas: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    flushed: int = 0
    # Unreachable or lost nodes the flush brought back to life, having found their heartbeats.
    revived: list[str] = field(default_factory=list)
    # Nodes silent past LLMGW_LOST_AFTER left unreachable because most of the
    # fleet was unreachable at once (0: the sweep did not hold back).
    held: int = 0
    # The sweep marked nothing: the control plane's own outage was too recent
    # (inventory.sweep decides; `grace_until` below).
    graced: bool = False


def mark_stale(now: datetime | None = None, grace_until: datetime | None = None) -> SweepResult:
    """Mark silent nodes unreachable, and long-silent ones lost unless most of the fleet is unreachable.

    Heartbeat times held in Redis are flushed first, reviving the nodes they
    name. Before `grace_until` nothing is marked: silence that began during the
    control plane's own outage is not the nodes' (`inventory.sweep` sets it).
    A node becoming lost has every replica with a shard on it released whole,
    since a replica fails whole. One node raising does not stop the rest;
    Redis being down stops nothing either (heartbeats then go to the database
    directly).
    """
    now = now or timezone.now()
    result = SweepResult()
    try:
        flushed = flush(now)
        result.flushed, result.revived = flushed.times, flushed.revived
    except redis.RedisError as exc:
        log.warning("sweeping without flushing heartbeat times, Redis is unavailable: %s", exc)
    if grace_until is not None and now < grace_until:
        result.graced = True
        return result
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
    reason = f"no heartbeat for {settings.LLMGW_UNREACHABLE_AFTER:g} s"
    changed = change_in_bulk(
        sorted(silent.values_list("pk", flat=True)), Liveness.ALIVE, Liveness.UNREACHABLE, reason, now
    )
    result.unreachable += changed.changed
    result.failed += changed.failed


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
