"""Node events: a compare-and-set change that records itself, repeats folded into one event, and their retention.

The update's filter holds the old value, so a late or repeated caller changes
nothing and records nothing; the update and the event commit together.

Events an agent's reports cause (an install moving, an engine failing or
restarting) are as frequent as the agent makes them: ten flapping inventories
wrote 320 events (issue 22). So a repeat (the same change of the same subject:
kind, subject, from and to state) within LLMGW_EVENT_COALESCE_SECONDS of its
last occurrence counts on that event (`repeats`, `last_at`) instead of adding a
row: a flapping install is two events however often it
flaps, while an install that goes installing, then ready, keeps both steps.
Every event older than LLMGW_EVENT_RETENTION_DAYS is deleted by beat (`prune`).
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import F, Q, QuerySet

from inventory.models import NodeEvent

# Deleted per statement, so that pruning a large backlog never holds one long transaction.
PRUNE_BATCH = 10_000


def change_and_record(rows: QuerySet, changes: dict[str, Any], event: NodeEvent) -> bool:
    """Apply `changes` to `rows` (already filtered on the old value); save `event` if any row changed."""
    with transaction.atomic():
        changed = rows.update(**changes)
        if changed:
            event.save()
    return bool(changed)


def record_folding_repeats(node_id: str, events: list[NodeEvent]) -> None:
    """Save a node's `events`, each folded into the latest of the same change if that is recent.

    The same change: kind, subject, from and to state. Recent: it last happened within
    LLMGW_EVENT_COALESCE_SECONDS of the new one. Folding counts one more repeat and moves
    `last_at` to the newest of `events`; `at` and `reason` stay the first's. One read, one
    UPDATE (with `F`, not a row-by-row CASE: a bulk_update of 32 events cost more than the
    rest of the inventory) and one INSERT, whatever the number of events or repeats.
    """
    window = timedelta(seconds=settings.LLMGW_EVENT_COALESCE_SECONDS)
    if not events or not window:
        NodeEvent.objects.bulk_create(events)
        return
    since = min(event.at for event in events) - window
    recent = NodeEvent.objects.filter(node_id=node_id, kind__in={event.kind for event in events}).filter(
        Q(last_at__gte=since) | Q(last_at__isnull=True, at__gte=since)
    )
    # Ascending, so that the latest of each change is the one kept.
    latest = {_change(event): event for event in recent.order_by("at", "id")}
    newest = max(event.at for event in events)
    new: list[NodeEvent] = []
    # Stored events folded into, by how many repeats each gains (one, but for a change listed twice).
    gained: dict[int, int] = {}
    for event in sorted(events, key=lambda event: event.at):
        last = latest.get(_change(event))
        if last is None or event.at - (last.last_at or last.at) > window:
            new.append(event)
            latest[_change(event)] = event
        elif last.pk is None:
            last.repeats, last.last_at = last.repeats + 1, event.at
        else:
            gained[last.pk] = gained.get(last.pk, 0) + 1
    with transaction.atomic():
        for count in set(gained.values()):
            ids = [pk for pk, n in gained.items() if n == count]
            NodeEvent.objects.filter(pk__in=ids).update(repeats=F("repeats") + count, last_at=newest)
        NodeEvent.objects.bulk_create(new)


def _change(event: NodeEvent) -> tuple[str, str, str, str]:
    """What makes two events repeats of one another."""
    return (event.kind, event.subject, event.from_state, event.to_state)


def prune(now: datetime) -> int:
    """Delete every event whose last occurrence is older than LLMGW_EVENT_RETENTION_DAYS; how many went."""
    cutoff = now - timedelta(days=settings.LLMGW_EVENT_RETENTION_DAYS)
    old = NodeEvent.objects.filter(Q(last_at__isnull=True) | Q(last_at__lt=cutoff), at__lt=cutoff)
    deleted = 0
    while True:
        batch = list(old.order_by().values_list("pk", flat=True)[:PRUNE_BATCH])
        if not batch:
            return deleted
        deleted += NodeEvent.objects.filter(pk__in=batch).delete()[0]
