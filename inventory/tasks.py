"""Celery tasks of the inventory: the stale-marking sweep, the reconciler and the events' retention."""

import logging

import redis
from celery import shared_task
from django.utils import timezone

from inventory import desired, events, sweep
from inventory.reconcile import reconcile as reconcile_pass
from livestate import locks, selfmetrics

log = logging.getLogger(__name__)

# A pass normally takes well under a second; the lock expires on its own if
# a worker dies holding it, so the next beat is never blocked for long.
RECONCILE_LOCK_SECONDS = 60


@shared_task(name="inventory.tasks.mark_stale")
def mark_stale() -> dict:
    """Run by beat every few seconds; idempotent, so a late or doubled run is harmless.

    It flushes the heartbeat times held in Redis (reviving the nodes they name)
    before it sweeps, so no separate flush task is scheduled. Sweeps never
    overlap, and none marks a node during the control plane's own outage or
    the grace period after it (inventory.sweep).
    """
    outcome = sweep.run()
    if outcome.skipped:
        selfmetrics.record(selfmetrics.sweep_skipped_fields())
        return {"skipped": outcome.skipped}
    result = outcome.result
    assert result is not None, "a sweep that was not skipped has a result"
    selfmetrics.record(
        selfmetrics.sweep_fields(
            len(result.unreachable),
            len(result.lost),
            len(result.failed),
            held_back=result.held > 0,
            revived=len(result.revived),
            graced=result.graced,
        )
    )
    return {
        "flushed": result.flushed,
        "revived": len(result.revived),
        "unreachable": result.unreachable,
        "lost": result.lost,
        "failed": result.failed,
        "held": result.held,
        "graced": result.graced,
        # Why a grace period began or went on in this run, if one did (inventory.sweep).
        "grace": outcome.grace_reason,
    }


@shared_task(name="inventory.tasks.reconcile")
def reconcile() -> dict:
    """Run by beat every few seconds. Passes never overlap: one that finds the lock taken skips.

    Overlapping passes would be safe (the database refuses double placements)
    but wasteful, since the second would mostly fail and retry.
    """
    lock = locks.reconcile_lock(RECONCILE_LOCK_SECONDS)
    if not lock.acquire():
        return {"skipped": "another pass is running"}
    try:
        return reconcile_pass().summary()
    finally:
        try:
            lock.release()
        except redis.exceptions.LockError:
            log.warning("reconcile lock expired before the pass ended")


@shared_task(name="inventory.tasks.prune_events")
def prune_events() -> dict:
    """Run by beat every hour: node events older than LLMGW_EVENT_RETENTION_DAYS go. Idempotent."""
    return {"deleted": events.prune(timezone.now())}


@shared_task(name="inventory.tasks.keep_shard_lists")
def keep_shard_lists() -> int | None:
    """Store every node's shard list afresh once a period, or at once after Redis lost them (inventory.desired)."""
    return desired.keep_cached()
