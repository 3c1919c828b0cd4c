"""Replica and shard state changes: created, failed, released, and as their agents report them.

Each change updates only rows still in the state it expects, so the reconciler,
the stale-marking sweep and heartbeats can meet on one replica without undoing
each other. A replica fails whole: one dead shard makes the others useless,
so its allocations are freed at once and a new replica is built elsewhere.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.db import transaction
from django.db.models import Exists, F, OuterRef, Q
from django.utils import timezone

from agent import protocol
from inventory.models import (
    GPU,
    LIVE_STATES,
    RUN_STATES,
    Allocation,
    Deployment,
    GPUClaim,
    GPUCondition,
    NodeEvent,
    Replica,
    ReplicaState,
    Shard,
)
from livestate import shardversion


def new_replicas(
    deployment: Deployment, count: int, reason: str, replaces: Replica | None = None, now: datetime | None = None
) -> list[Replica]:
    """Create `count` pending replicas with ordinals never used before by this deployment."""
    if count <= 0:
        return []
    now = now or timezone.now()
    with transaction.atomic():
        Deployment.objects.filter(pk=deployment.pk).update(next_ordinal=F("next_ordinal") + count)
        end = Deployment.objects.values_list("next_ordinal", flat=True).get(pk=deployment.pk)
        replicas = Replica.objects.bulk_create(
            Replica(
                deployment=deployment,
                ordinal=ordinal,
                replica_id=f"{deployment.name}-r{ordinal}",
                state=ReplicaState.PENDING,
                reason=reason,
                changed_at=now,
                created_at=now,
                replaces=replaces,
            )
            for ordinal in range(end - count, end)
        )
    return replicas


def fail_replicas(replica_ids: Iterable[str], reason: str, now: datetime | None = None) -> list[str]:
    """Declare replicas dead, whole, and free everything they held. Returns those that changed."""
    ids = sorted(set(replica_ids))
    if not ids:
        return []
    now = now or timezone.now()
    with transaction.atomic():
        changing = list(
            Replica.objects.filter(replica_id__in=ids, state__in=(*LIVE_STATES, ReplicaState.RELEASING)).values_list(
                "replica_id", flat=True
            )
        )
        shards = Shard.objects.filter(replica__replica_id__in=changing)
        held = set(shards.values_list("replica__replica_id", "node_id"))
        nodes = {node_id for _, node_id in held}
        Replica.objects.filter(replica_id__in=changing).update(state=ReplicaState.FAILED, reason=reason, changed_at=now)
        shards.update(state=ReplicaState.FAILED, reason=reason, changed_at=now)
        record_replica_events(held, ReplicaState.FAILED, reason, now)
        # Allocations go even for replicas no row describes: whatever held
        # resources for a dead replica must free them.
        Allocation.objects.filter(replica_id__in=ids).delete()
    shardversion.bump(nodes)
    return sorted(changing)


def fail_gpu_holders(gpus: Iterable[tuple[str, int]], why: str, now: datetime | None = None) -> list[str]:
    """Fail, whole, every replica holding one of these GPUs (node id, index): its engine cannot run there.

    `why` finishes "GPU <index> of <node> …" in the replica's reason.
    """
    by_node: dict[str, list[int]] = {}
    for node_id, index in gpus:
        by_node.setdefault(node_id, []).append(index)
    nodes = sorted(by_node)
    failed: list[str] = []
    # A condition per node, a few hundred nodes at a time: SQLite refuses an expression deeper than 1,000.
    for start in range(0, len(nodes), 200):
        wanted = Q(pk__in=[])
        for node_id in nodes[start : start + 200]:
            wanted |= Q(node_id=node_id, gpu_index__in=by_node[node_id])
        failed += _fail_claim_holders(GPUClaim.objects.filter(wanted), why, now)
    return failed


def fail_on_unusable_gpus(placed_since: datetime, now: datetime | None = None) -> list[str]:
    """Fail every replica that claims a failed GPU, or, placed since `placed_since`, one no longer listed.

    Registration and inventory.gpuhealth fail such replicas as they change a
    GPU; this catches the claims a placement pass wrote at the same moment,
    from a snapshot read just before. Only recent claims can have missed a
    GPU's removal, and looking only at them keeps this cheap enough for every
    reconcile pass (the anti-join over every claim of a 10,000-node fleet
    costs over 100 ms on PostgreSQL; failed GPUs are few and indexed).
    """
    failed_gpus = list(GPU.objects.filter(condition=GPUCondition.FAILED).values_list("node_id", "index"))
    changed = fail_gpu_holders(failed_gpus, "failed", now) if failed_gpus else []
    # The recent allocations first, then their claims: given as one join, SQLite
    # runs the anti-join over every claim before it filters.
    # Chunked, as a burst of placements can outnumber the parameters SQLite takes in one statement.
    recent = list(Allocation.objects.filter(created_at__gte=placed_since).values_list("pk", flat=True))
    for start in range(0, len(recent), 2000):
        missing = GPUClaim.objects.filter(allocation_id__in=recent[start : start + 2000]).filter(
            ~Exists(_claimed_gpu())
        )
        changed += _fail_claim_holders(missing, "vanished from its inventory", now)
    return changed


def _claimed_gpu():
    return GPU.objects.filter(node_id=OuterRef("node_id"), index=OuterRef("gpu_index"))


def _fail_claim_holders(claims, why: str, now: datetime | None) -> list[str]:
    """Fail the replicas of these claims; `why` says what became of the GPU."""
    reasons: dict[str, str] = {}
    rows = claims.order_by("node_id", "gpu_index").values_list("allocation__replica_id", "node_id", "gpu_index")
    for replica_id, node_id, index in rows:
        reasons.setdefault(replica_id, f"GPU {index} of {node_id} {why}")
    failed: list[str] = []
    for replica_id, reason in sorted(reasons.items()):
        failed += fail_replicas([replica_id], reason, now)
    return failed


def begin_release(replicas: Iterable[Replica], reason: str, now: datetime | None = None) -> list[str]:
    """Ask the agents to stop these replicas; a replica never placed is simply removed.

    A placed replica keeps its GPUs and memory until its engines have stopped
    (`finish_release`), so nothing new is started on a GPU still in use.
    """
    now = now or timezone.now()
    replicas = list(replicas)
    pending = [r.pk for r in replicas if r.state == ReplicaState.PENDING]
    placed = [r.pk for r in replicas if r.state in RUN_STATES]
    with transaction.atomic():
        Replica.objects.filter(pk__in=pending, state=ReplicaState.PENDING).delete()
        changed = list(Replica.objects.filter(pk__in=placed, state__in=RUN_STATES).values_list("pk", flat=True))
        Replica.objects.filter(pk__in=changed).update(state=ReplicaState.RELEASING, reason=reason, changed_at=now)
        shards = Shard.objects.filter(replica__in=changed)
        held = set(shards.values_list("replica__replica_id", "node_id"))
        nodes = {node_id for _, node_id in held}
        shards.update(state=ReplicaState.RELEASING, reason=reason, changed_at=now)
        record_replica_events(held, ReplicaState.RELEASING, reason, now)
    shardversion.bump(nodes)
    return sorted(r.replica_id for r in replicas if r.pk in set(pending) | set(changed))


def record_replica_events(
    held: Iterable[tuple[str, str | None]], to_state: str, reason: str, now: datetime, from_state: str = ""
) -> None:
    """One REPLICA event per (replica id, node id) pair, in one INSERT."""
    NodeEvent.objects.bulk_create(replica_events(held, to_state, reason, now, from_state))


def replica_events(
    held: Iterable[tuple[str, str | None]], to_state: str, reason: str, now: datetime, from_state: str = ""
) -> list[NodeEvent]:
    """The REPLICA events, unsaved; a shard with no node has no page to show one on."""
    return [
        NodeEvent(
            node_id=node_id,
            at=now,
            kind=NodeEvent.Kind.REPLICA,
            from_state=from_state,
            to_state=to_state,
            reason=f"replica {replica_id}: {reason}" if reason else f"replica {replica_id}",
            actor="system",
        )
        for replica_id, node_id in sorted(held, key=lambda pair: (pair[0], pair[1] or ""))
        if node_id
    ]


def finish_release(shard_ids: Iterable[str]) -> list[str]:
    """Free what stopped shards held and forget them; a replica with no shard left goes too."""
    ids = sorted(set(shard_ids))
    if not ids:
        return []
    with transaction.atomic():
        rows = set(Shard.objects.filter(shard_id__in=ids).values_list("replica_id", "node_id"))
        Allocation.objects.filter(shard_id__in=ids).delete()
        Shard.objects.filter(shard_id__in=ids, state=ReplicaState.RELEASING).delete()
        replica_pks = {replica_pk for replica_pk, _ in rows}
        Replica.objects.filter(pk__in=replica_pks, state=ReplicaState.RELEASING, shards__isnull=True).delete()
    shardversion.bump(node_id for _, node_id in rows)
    return ids


# How an agent's word on a shard maps onto the shard's state.
_REPORTED = {
    "starting": ReplicaState.STARTING,
    "restarting": ReplicaState.STARTING,
    "exited": ReplicaState.STARTING,
    "running": ReplicaState.RUNNING,
    "stopped": ReplicaState.PLACED,
    "failed": ReplicaState.FAILED,
}


@dataclass
class ReportEffects:
    """What an agent's report would change, worked out without writing anything."""

    node_id: str
    changed: list[tuple[Shard, str, str, int]] = field(default_factory=list)
    stopped: list[str] = field(default_factory=list)
    failed: dict[str, str] = field(default_factory=dict)
    # This node's shards of the failed replicas: no longer to be run.
    failed_shards: set[str] = field(default_factory=set)
    # (to_state, reason) of each engine that failed or restarted since the last report: ENGINE events.
    engine_events: list[tuple[str, str]] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.changed or self.stopped or self.failed)


def read_reports(node_id: str, shards: list[Any], reports: Iterable[protocol.ShardStatus]) -> ReportEffects:
    """Compare a node's shards with what its agent says of them.

    `shards` are the node's shards that are meant to run or being released: `Shard`
    rows, or the shard-list cache's `ShardFacts` (the same attribute names).
    A report is the whole truth: a releasing shard it does not list has
    stopped, and a started shard it does not list is no longer running.
    """
    reported = {status.shard: status for status in reports}
    effects = ReportEffects(node_id)
    for shard in shards:
        status = reported.get(shard.shard_id)
        if shard.state == ReplicaState.RELEASING:
            if status is None or status.state in ("stopped", "exited", "failed"):
                effects.stopped.append(shard.shard_id)
        elif status is None:
            # The agent restarted or lost the process; it is still told to
            # run the shard, so it starts it again.
            if shard.state in (ReplicaState.STARTING, ReplicaState.RUNNING):
                effects.changed.append((shard, ReplicaState.PLACED, "not reported by the agent", shard.metrics_port))
        elif _REPORTED[status.state] == ReplicaState.FAILED:
            reason = f"shard {shard.shard_id} failed on {node_id}: {_describe(status)}"
            effects.failed[shard.replica.replica_id] = reason
            effects.engine_events.append(("failed", f"{shard.shard_id}: {_describe_failure(status)}"))
        else:
            new = (_REPORTED[status.state], _describe(status), status.metrics_port)
            if new != (shard.state, shard.reason, shard.metrics_port):
                effects.changed.append((shard, *new))
                before = _restarts_in(shard.reason)
                if status.restarts > before:
                    words = f"restarted ({before} → {status.restarts} restarts)"
                    effects.engine_events.append(("restarted", f"{shard.shard_id} {words}: {_describe(status)}"))
    effects.failed_shards = {s.shard_id for s in shards if s.replica.replica_id in effects.failed}
    return effects


def apply_reports(effects: ReportEffects) -> set[str]:
    """Write what `read_reports` found. Returns the shard ids no longer to be run."""
    now = timezone.now()
    NodeEvent.objects.bulk_create(
        NodeEvent(node_id=effects.node_id, at=now, kind=NodeEvent.Kind.ENGINE, to_state=state, reason=reason)
        for state, reason in effects.engine_events
    )
    changed = []
    for shard, state, reason, metrics_port in effects.changed:
        shard.state, shard.reason, shard.metrics_port, shard.changed_at = state, reason, metrics_port, now
        changed.append(shard)
    if changed:
        Shard.objects.bulk_update(changed, ["state", "reason", "metrics_port", "changed_at"])
        roll_up({shard.replica_id for shard in changed}, now)
        shardversion.bump([effects.node_id])
    for replica_id, reason in effects.failed.items():
        fail_replicas([replica_id], reason, now)
    finish_release(effects.stopped)
    return set(effects.stopped) | effects.failed_shards


def roll_up(replica_pks: Iterable[int], now: datetime | None = None) -> None:
    """A replica runs when all its shards run; it is starting while any has begun."""
    now = now or timezone.now()
    states: dict[int, list[str]] = {}
    for replica_pk, state in Shard.objects.filter(replica__in=set(replica_pks)).values_list("replica_id", "state"):
        states.setdefault(replica_pk, []).append(state)
    for replica_pk, shard_states in states.items():
        if all(s == ReplicaState.RUNNING for s in shard_states):
            state, reason = ReplicaState.RUNNING, "all shards running"
        elif any(s in (ReplicaState.RUNNING, ReplicaState.STARTING) for s in shard_states):
            running = sum(s == ReplicaState.RUNNING for s in shard_states)
            state, reason = ReplicaState.STARTING, f"{running} of {len(shard_states)} shards running"
        else:
            state, reason = ReplicaState.PLACED, "waiting for the agents to start it"
        Replica.objects.filter(pk=replica_pk, state__in=RUN_STATES).exclude(state=state, reason=reason).update(
            state=state, reason=reason, changed_at=now
        )


# The shard row keeps no restart count of its own; the reason `_describe` wrote
# for the last report carries it, so that is where the previous count is read.
_RESTARTS = re.compile(r"(?:^|, )(\d+) restarts(?:,|$)")


def _restarts_in(reason: str) -> int:
    found = _RESTARTS.search(reason)
    return int(found.group(1)) if found else 0


def _describe_failure(status: protocol.ShardStatus) -> str:
    """Exit code and the last line the engine wrote: what an operator reads first."""
    words = ["engine failed"]
    if status.exit_code is not None:
        words.append(f"exit code {status.exit_code}")
    last = status.detail.strip().splitlines()[-1] if status.detail.strip() else ""
    if last:
        words.append(last)
    return ", ".join(words)


def _describe(status: protocol.ShardStatus) -> str:
    words: list[str] = [status.state]
    if status.exit_code is not None:
        words.append(f"exit code {status.exit_code}")
    if status.restarts:
        words.append(f"{status.restarts} restarts")
    if status.detail:
        words.append(status.detail)
    return ", ".join(words)
