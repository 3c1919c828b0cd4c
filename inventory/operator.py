"""Operator actions: cordon, drain and uncordon, each recorded with who, when and why."""

from __future__ import annotations

from django.contrib.admin.models import CHANGE, LogEntry
from django.contrib.contenttypes.models import ContentType
from django.db import transaction
from django.utils import timezone

from inventory.events import change_and_record
from inventory.models import AdminState, Node, NodeEvent


class ReasonRequired(ValueError):
    """An operator action without a reason: the next operator needs to know why."""


ACTIONS = {
    "cordon": AdminState.CORDONED,
    "drain": AdminState.DRAINING,
    "uncordon": AdminState.ACTIVE,
}


def set_admin_state(node: Node, new_state: AdminState, user, reason: str) -> bool:
    """Change a node's admin state, recording it on the node, as an event and in the admin log.

    Returns False (and records nothing) when the node is already in that state.
    """
    reason = reason.strip()
    if not reason:
        raise ReasonRequired("a reason is required")
    now = timezone.now()
    actor = user.get_username()
    with transaction.atomic():
        old_state = Node.objects.select_for_update().values_list("admin_state", flat=True).get(pk=node.pk)
        if old_state == new_state:
            return False
        Node.objects.filter(pk=node.pk).update(
            admin_state=new_state, admin_state_by=actor, admin_state_at=now, admin_state_reason=reason
        )
        NodeEvent.objects.create(
            node=node,
            at=now,
            kind=NodeEvent.Kind.ADMIN,
            from_state=old_state,
            to_state=new_state,
            reason=reason,
            actor=actor,
        )
        LogEntry.objects.create(
            user_id=user.pk,
            content_type_id=ContentType.objects.get_for_model(Node).pk,
            object_id=str(node.pk),
            object_repr=str(node)[:200],
            action_flag=CHANGE,
            change_message=f"{old_state} → {new_state}: {reason}",
        )
    node.refresh_from_db(fields=["admin_state", "admin_state_by", "admin_state_at", "admin_state_reason"])
    return True


def finish_drain(node_id: str, now=None) -> bool:
    """A draining node with nothing left on it becomes cordoned, recorded as done by the system.

    Compare-and-set: only a node still draining changes, so an operator who
    uncordoned it meanwhile wins, and a second pass records nothing twice.
    """
    now = now or timezone.now()
    reason = "drain finished: nothing left on the node"
    return change_and_record(
        Node.objects.filter(pk=node_id, admin_state=AdminState.DRAINING),
        {
            "admin_state": AdminState.CORDONED,
            "admin_state_by": "system",
            "admin_state_at": now,
            "admin_state_reason": reason,
        },
        NodeEvent(
            node_id=node_id,
            at=now,
            kind=NodeEvent.Kind.ADMIN,
            from_state=AdminState.DRAINING,
            to_state=AdminState.CORDONED,
            reason=reason,
            actor="system",
        ),
    )
