"""A compare-and-set change that records itself: the node event is written only when a row moved.

The update's filter holds the old value, so a late or repeated caller changes
nothing and records nothing; the update and the event commit together.
"""

from __future__ import annotations

from typing import Any

from django.db import transaction
from django.db.models import QuerySet

from inventory.models import NodeEvent


def change_and_record(rows: QuerySet, changes: dict[str, Any], event: NodeEvent) -> bool:
    """Apply `changes` to `rows` (already filtered on the old value); save `event` if any row changed."""
    with transaction.atomic():
        changed = rows.update(**changes)
        if changed:
            event.save()
    return bool(changed)
