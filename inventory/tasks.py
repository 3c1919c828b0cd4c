"""Celery tasks of the inventory: the stale-marking sweep."""

from celery import shared_task

from inventory.liveness import mark_stale as sweep
from nodes import selfmetrics


@shared_task(name="inventory.tasks.mark_stale")
def mark_stale() -> dict:
    """Run by beat every few seconds; idempotent, so a late or doubled run is harmless.

    It flushes the heartbeat times held in Redis before it sweeps, so no separate
    flush task is scheduled.
    """
    result = sweep()
    selfmetrics.record(selfmetrics.sweep_fields(len(result.unreachable), len(result.lost), len(result.failed)))
    return {"flushed": result.flushed, "unreachable": result.unreachable, "lost": result.lost, "failed": result.failed}
