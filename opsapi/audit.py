"""Actions through a token, recorded like the admin's: who, when, why, and through which token.

Node state changes go through `inventory.operator.set_admin_state`, the one
operation the admin and the pages use, so the node's history and the admin
log carry them the same way; the token is named in both.
"""

from __future__ import annotations

from dataclasses import dataclass

from django.contrib.admin.models import LogEntry
from django.contrib.contenttypes.models import ContentType
from django.db import models, transaction

from inventory.models import AdminState, Node
from inventory.operator import set_admin_state
from opsapi.models import ApiToken

ACTOR_LENGTH = 150


@dataclass(frozen=True)
class TokenActor:
    """The user as history names them when acting through a token ("alice via token laptop (ab12…)")."""

    user: models.Model
    token: ApiToken

    @property
    def pk(self):
        return self.user.pk

    def get_username(self) -> str:
        return f"{self.user.get_username()} via token {self.token.label}"[:ACTOR_LENGTH]


def through_token(token: ApiToken) -> str:
    return f" (through API token {token.label})"


def change_node(node: Node, new_state: AdminState, token: ApiToken, reason: str) -> bool:
    """set_admin_state, with the token named in the node's history and in the admin log entry."""
    with transaction.atomic():
        changed = set_admin_state(node, new_state, TokenActor(token.user, token), reason)
        if changed:
            entry = (
                LogEntry.objects.filter(
                    user_id=token.user_id,
                    content_type_id=ContentType.objects.get_for_model(Node).pk,
                    object_id=str(node.pk),
                )
                .order_by("-pk")
                .first()
            )
            if entry is not None:
                LogEntry.objects.filter(pk=entry.pk).update(change_message=entry.change_message + through_token(token))
    return changed


def log_action(token: ApiToken, instance: models.Model, flag: int, message: str) -> None:
    """An admin log entry for a change made through a token (deployments)."""
    LogEntry.objects.create(
        user_id=token.user_id,
        content_type_id=ContentType.objects.get_for_model(type(instance)).pk,
        object_id=str(instance.pk),
        object_repr=str(instance)[:200],
        action_flag=flag,
        change_message=message + through_token(token),
    )
