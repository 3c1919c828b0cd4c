"""The reconciler: makes the replicas that exist match the replicas wanted.

One pass, run by Celery beat every few seconds, in this order:

1. finish releases whose engines have stopped (or whose node is gone);
2. fail replicas with a shard on a lost or vanished node (the stale sweep
   normally did it already), or holding a GPU gone from its node's inventory
   or failed (registration and inventory.gpuhealth normally did it already,
   but a placement written at the same moment may have missed it), or
   placed on a node whose agent could not install the shard's engine (the
   replacement is placed elsewhere); degraded GPUs whose agents have
   reported enough clean samples since become healthy again
   (inventory.gpuhealth.recover);
3. drains: a replica on a draining node gets a replacement; once the
   replacement runs, the old one is released;
4. scale: create pending replicas up to the number wanted, release the
   newest beyond it;
5. place every pending replica, all or nothing, on one snapshot of the fleet;
6. a draining node with nothing left on it becomes cordoned;
7. forget failed replicas after an hour.

Every step reads the state afresh and changes only rows still in the state
it expects, so a pass that runs twice, late, or beside another changes
nothing twice; the database refuses a GPU in two allocations whatever happens.
"""

from __future__ import annotations

import logging
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from inventory import drainhold, engine_wants
from inventory.gpuhealth import recover
from inventory.models import (
    LIVE_STATES,
    RUN_STATES,
    AdminState,
    Allocation,
    Deployment,
    GPUClaim,
    Liveness,
    Node,
    NodeEvent,
    Replica,
    ReplicaState,
    Shard,
)
from inventory.operator import finish_drain
from inventory.placement import CannotPlace, Placement, Planner, Profile, load_fleet
from inventory.replicas import (
    begin_release,
    fail_on_unusable_gpus,
    fail_replicas,
    finish_release,
    new_replicas,
    replica_events,
)
from livestate import shardversion

log = logging.getLogger(__name__)

# How long a releasing shard waits for its agent to say the engine stopped,
# after the drain's hold (inventory.drainhold) may have kept it running, before
# its GPUs are handed out anyway (an agent that never answers must not hold
# them for ever).
RELEASE_GRACE = timedelta(seconds=60)
# Placements younger than this are checked for GPUs removed while they were
# written (replicas.fail_on_unusable_gpus); a pass takes well under a second.
RECENT_PLACEMENTS = timedelta(minutes=5)
# A replica created this soon after one of its deployment's replicas failed is
# taken as that one's rebuild: the pass that fails a replica (or the next one,
# seconds after a heartbeat failed it) creates its replacement.
REBUILD_WINDOW = timedelta(minutes=1)
# How long a failed replica stays visible in the admin, with its reason.
FAILED_KEPT_FOR = timedelta(hours=1)


@dataclass
class ReconcileResult:
    created: list[str] = field(default_factory=list)
    placed: list[str] = field(default_factory=list)
    unplaced: dict[str, str] = field(default_factory=dict)
    releasing: list[str] = field(default_factory=list)
    released: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    cordoned: list[str] = field(default_factory=list)
    recovered_gpus: list[str] = field(default_factory=list)
    pruned: int = 0

    def summary(self) -> dict:
        return {
            "created": len(self.created),
            "placed": len(self.placed),
            "unplaced": len(self.unplaced),
            "releasing": len(self.releasing),
            "released": len(self.released),
            "failed": len(self.failed),
            "cordoned": self.cordoned,
            "recovered_gpus": self.recovered_gpus,
        }


def reconcile(now: datetime | None = None) -> ReconcileResult:
    now = now or timezone.now()
    result = ReconcileResult()
    _finish_releases(now, result)
    _fail_stranded(now, result)
    _fail_uninstallable(now, result)
    _drain(now, result)
    _scale(now, result)
    _place(now, result)
    _cordon_drained(now, result)
    _prune(now, result)
    return result


def _finish_releases(now: datetime, result: ReconcileResult) -> None:
    given_up = now - drainhold.deadline() - RELEASE_GRACE
    done = Shard.objects.filter(state=ReplicaState.RELEASING).filter(
        Q(node__isnull=True) | ~Q(node__liveness=Liveness.ALIVE) | Q(changed_at__lt=given_up)
    )
    result.released += finish_release(done.values_list("shard_id", flat=True))
    # A releasing replica that never had shards placed has nothing to wait for.
    Replica.objects.filter(state=ReplicaState.RELEASING, shards__isnull=True).delete()


def _fail_stranded(now: datetime, result: ReconcileResult) -> None:
    stranded = Shard.objects.filter(state__in=RUN_STATES).filter(Q(node__isnull=True) | Q(node__liveness=Liveness.LOST))
    reasons: dict[str, str] = {}
    for replica_id, node_id in stranded.values_list("replica__replica_id", "node_id"):
        reasons.setdefault(replica_id, f"node {node_id} lost" if node_id else "its node was removed")
    for replica_id, reason in sorted(reasons.items()):
        result.failed += fail_replicas([replica_id], reason, now)
    result.failed += fail_on_unusable_gpus(placed_since=now - RECENT_PLACEMENTS, now=now)
    result.recovered_gpus += [f"{node_id}/{index}" for node_id, index in recover(now)]


def _fail_uninstallable(now: datetime, result: ReconcileResult) -> None:
    """Fail replicas waiting for an engine their node reported failed or unsupported."""
    waiting = list(
        Shard.objects.filter(
            state=ReplicaState.PLACED, replica__deployment__engine__in=engine_wants.INSTALLED_BY_LLMGW
        ).values_list(
            "replica__replica_id", "node_id", "replica__deployment__engine", "replica__deployment__gpus_per_shard"
        )
    )
    if not waiting:
        return
    blocked = engine_wants.blocked_installs({node_id for _, node_id, _, _ in waiting})
    reasons: dict[str, str] = {}
    for replica_id, node_id, engine, gpus in waiting:
        why = blocked.get(node_id, {}).get((engine, engine_wants.variant(gpus)))
        if why:
            reasons.setdefault(replica_id, f"{engine} cannot run on {node_id}: {why}")
    for replica_id, reason in sorted(reasons.items()):
        result.failed += fail_replicas([replica_id], reason, now)


def _drain(now: datetime, result: ReconcileResult) -> None:
    """Replace what runs on draining nodes, and release the old once the new one runs."""
    replacements = {
        r.replaces_id: r
        for r in Replica.objects.filter(replaces__isnull=False, state__in=LIVE_STATES).select_related("replaces")
    }
    for new in replacements.values():
        old = new.replaces
        if new.state == ReplicaState.RUNNING and old.state in RUN_STATES:
            result.releasing += begin_release([old], f"replaced by {new.replica_id}, now running", now)
    draining = list(Node.objects.filter(admin_state=AdminState.DRAINING).values_list("pk", flat=True))
    on_draining = {
        r.pk: r
        for r in Replica.objects.filter(state__in=RUN_STATES, shards__node__in=draining)
        .select_related("deployment")
        .distinct()
    }
    for old in sorted(on_draining.values(), key=lambda r: r.replica_id):
        if old.pk not in replacements:
            nodes = sorted(set(old.shards.filter(node__in=draining).values_list("node_id", flat=True)))
            reason = f"replaces {old.replica_id}: {', '.join(nodes)} draining"
            result.created += [r.replica_id for r in new_replicas(old.deployment, 1, reason, replaces=old, now=now)]
    # An operator who stops a drain keeps the old replica; a replacement not
    # yet serving is then surplus.
    for old_pk, new in replacements.items():
        if old_pk not in on_draining and new.state != ReplicaState.RUNNING and new.replaces.state in RUN_STATES:
            result.releasing += begin_release([new], f"drain of {new.replaces.replica_id} stopped", now)


def _scale(now: datetime, result: ReconcileResult) -> None:
    live = list(Replica.objects.filter(state__in=LIVE_STATES).order_by("ordinal"))
    replaced = {r.replaces_id for r in live if r.replaces_id}
    by_pk = {r.pk: r for r in live}
    counted = defaultdict(list)
    for replica in live:
        if replica.pk not in replaced:
            counted[replica.deployment_id].append(replica)
    for deployment in Deployment.objects.all():
        have = counted[deployment.pk]
        if len(have) < deployment.replicas:
            missing = deployment.replicas - len(have)
            made = new_replicas(deployment, missing, "waiting for placement", now=now)
            result.created += [r.replica_id for r in made]
        elif len(have) > deployment.replicas:
            # Unplaced replicas first, as they serve nothing; then the newest.
            order = sorted(have, key=lambda r: (r.state != ReplicaState.PENDING, -r.ordinal))
            excess = order[: len(have) - deployment.replicas]
            # A replacement leaving takes the replica it was replacing along:
            # that one is on a draining node and on its way out anyway.
            excess += [by_pk[r.replaces_id] for r in excess if r.replaces_id in by_pk]
            reason = f"scaled down to {deployment.replicas}"
            result.releasing += begin_release(excess, reason, now)


def _place(now: datetime, result: ReconcileResult) -> None:
    pending = list(
        Replica.objects.filter(state=ReplicaState.PENDING)
        .select_related("deployment")
        .order_by("deployment__name", "ordinal")
    )
    if not pending:
        return
    deployments = {r.deployment_id: r.deployment for r in pending}
    fleet = load_fleet(d.model_source for d in deployments.values() if d.model_is_path)
    spread = _spread(deployments)
    # A deployment's planner is made when its turn comes, so it sees what the
    # deployments before it took.
    planners: dict[int, Planner] = {}
    placed: list[tuple[Replica, Placement]] = []
    unplaced: list[Replica] = []
    for replica in pending:
        pk = replica.deployment_id
        if pk not in planners:
            planners[pk] = Planner(fleet, Profile.of(deployments[pk]), spread[pk])
        outcome = planners[pk].place()
        if isinstance(outcome, CannotPlace):
            result.unplaced[replica.replica_id] = outcome.reason
            reason = f"cannot place: {outcome.reason}"
            if replica.reason != reason:
                replica.reason, replica.changed_at = reason, now
                unplaced.append(replica)
        else:
            placed.append((replica, outcome))
    with transaction.atomic():
        if unplaced:
            Replica.objects.bulk_update(unplaced, ["reason", "changed_at"])
        if placed:
            record_placements(placed, now)
    result.placed += [replica.replica_id for replica, _ in placed]


def _spread(deployments: dict[int, Deployment]) -> dict[int, Counter]:
    """How many live replicas of each deployment each node already holds."""
    rows = set(
        Shard.objects.filter(state__in=RUN_STATES, replica__deployment__in=deployments.keys(), node__isnull=False)
        .values_list("replica__deployment_id", "replica_id", "node_id")
        .order_by()
    )
    spread: dict[int, Counter] = defaultdict(Counter)
    for deployment_pk, _, node_id in rows:
        spread[deployment_pk][node_id] += 1
    return spread


def record_placements(placed: list[tuple[Replica, Placement]], now: datetime) -> None:
    """Write every placement of the pass in a few bulk statements.

    The replicas are still pending only if no other pass placed them first:
    the update below is the compare-and-set, and the unique shard ids and GPU
    claims make the database refuse a double placement outright.
    """
    pks = [replica.pk for replica, _ in placed]
    if Replica.objects.filter(pk__in=pks, state=ReplicaState.PENDING).count() != len(pks):
        raise RuntimeError("replicas were placed by another pass; this pass stops")
    allocations, shards, gpus_of = [], [], {}
    by_fabric: dict[str, list[int]] = defaultdict(list)
    for replica, placement in placed:
        deployment = replica.deployment
        by_fabric[placement.fabric].append(replica.pk)
        for part in placement.shards:
            shard_id = f"{replica.replica_id}-s{part.index}"
            shards.append(
                Shard(
                    replica=replica,
                    shard_id=shard_id,
                    index=part.index,
                    node_id=part.node_id,
                    state=ReplicaState.PLACED,
                    reason="waiting for the agent to start it",
                    changed_at=now,
                    gpu_indices=part.gpus,
                    hcas=part.hcas,
                    port=part.port,
                )
            )
            allocations.append(
                Allocation(
                    node_id=part.node_id,
                    shard_id=shard_id,
                    replica_id=replica.replica_id,
                    model=deployment.model_source,
                    memory_gb=deployment.memory_gb_per_shard,
                    cpu_cores=deployment.cpu_cores_per_shard,
                )
            )
            gpus_of[shard_id] = (part.node_id, part.gpus)
    Allocation.objects.bulk_create(allocations)
    Shard.objects.bulk_create(shards)
    GPUClaim.objects.bulk_create(
        GPUClaim(allocation=allocation, node_id=node_id, gpu_index=index)
        for allocation in allocations
        for node_id, indices in [gpus_of[allocation.shard_id]]
        for index in indices
    )
    # One UPDATE per fabric rather than a row-by-row bulk_update: where each
    # shard went is on the shard rows.
    for fabric, pks in by_fabric.items():
        reason = "placed; waiting for its agents to start it" + (f" (over fabric {fabric})" if fabric else "")
        Replica.objects.filter(pk__in=pks).update(
            state=ReplicaState.PLACED, reason=reason, changed_at=now, fabric=fabric
        )
    _record_placed_events(placed, now)
    shardversion.bump(part.node_id for _, placement in placed for part in placement.shards)


def _record_placed_events(placed: list[tuple[Replica, Placement]], now: datetime) -> None:
    """A REPLICA event on each node a replica went to, saying what it rebuilds, if anything.

    A drain's replacement names the replica it replaces; any other new replica
    rebuilds a failed one of its deployment when it was created within
    REBUILD_WINDOW after that one failed. Two queries whatever the pass placed.
    """
    replaced = {r.replaces_id for r, _ in placed if r.replaces_id}
    old_ids = dict(Replica.objects.filter(pk__in=replaced).values_list("pk", "replica_id")) if replaced else {}
    earliest = min(r.created_at for r, _ in placed) - REBUILD_WINDOW
    failed: dict[int, list[tuple[datetime, str, str]]] = defaultdict(list)
    rows = Replica.objects.filter(
        state=ReplicaState.FAILED, deployment__in={r.deployment_id for r, _ in placed}, changed_at__gte=earliest
    ).order_by("changed_at", "ordinal")
    for deployment_pk, changed_at, replica_id, reason in rows.values_list(
        "deployment_id", "changed_at", "replica_id", "reason"
    ):
        failed[deployment_pk].append((changed_at, replica_id, reason))
    events: list[NodeEvent] = []
    for replica, placement in placed:
        nodes = sorted({part.node_id for part in placement.shards})
        if replica.replaces_id:
            why = f"placed, rebuilding {old_ids.get(replica.replaces_id, '?')} (drained)"
        else:
            candidates = failed[replica.deployment_id]
            match = next(
                (c for c in candidates if c[0] <= replica.created_at <= c[0] + REBUILD_WINDOW),
                None,
            )
            if match:
                candidates.remove(match)
                why = f"placed, rebuilding {match[1]} (failed: {match[2]})"
            else:
                why = "placed"
        held = [(replica.replica_id, node_id) for node_id in nodes]
        events += replica_events(held, ReplicaState.PLACED, why, now, ReplicaState.PENDING)
    NodeEvent.objects.bulk_create(events)


def _cordon_drained(now: datetime, result: ReconcileResult) -> None:
    draining = set(Node.objects.filter(admin_state=AdminState.DRAINING).values_list("pk", flat=True))
    if not draining:
        return
    busy = set(Allocation.objects.filter(node_id__in=draining).values_list("node_id", flat=True))
    holding = (*RUN_STATES, ReplicaState.RELEASING)
    busy |= set(Shard.objects.filter(node_id__in=draining, state__in=holding).values_list("node_id", flat=True))
    for node_id in sorted(draining - busy):
        if finish_drain(node_id, now):
            result.cordoned.append(node_id)


def _prune(now: datetime, result: ReconcileResult) -> None:
    old = Replica.objects.filter(state=ReplicaState.FAILED, changed_at__lt=now - FAILED_KEPT_FOR)
    result.pruned, _ = old.delete()
