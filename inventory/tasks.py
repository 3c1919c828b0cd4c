"""Celery tasks of the inventory: the stale-marking sweep."""

from celery import shared_task

from inventory.liveness import mark_stale as sweep
from nodes import selfmetrics


@shared_task(name="inventory.tasks.mark_stale")
def mark_stale() -> dict:
    """Run by beat every few seconds; idempotent, so a late or doubled run is harmless."""
    result = sweep()
    selfmetrics.record(selfmetrics.sweep_fields(len(result.unreachable), len(result.lost), len(result.failed)))
    return {"unreachable": result.unreachable, "lost": result.lost, "failed": result.failed}
