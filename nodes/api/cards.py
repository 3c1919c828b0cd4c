"""A node's card (livestate.cards) as the database has it, and the saves that make cached cards stale.

Every change of what a card holds records a NodeEvent (liveness, admin state,
registration, token revocation) or saves or deletes a NodeToken or a Node, so
the receivers below invalidate the node's cards on those saves without the code
that makes the change having to know about this cache. They are connected in
`NodesConfig.ready()`.
"""

from __future__ import annotations

from django.db.models.signals import post_delete, post_save

from inventory.models import Node, NodeEvent
from livestate.cards import NodeCard, invalidate
from nodes.models import NodeToken, digest_matches


def from_database(node_id: str, generation: int = 0) -> NodeCard | None:
    """The node's card as the database has it; None if the node has no token."""
    row = (
        NodeToken.objects.filter(node_id=node_id)
        .values_list("secret_digest", "node__liveness", "node__admin_state", "node__inventory_hash")
        .first()
    )
    if row is None:
        return None
    secret_digest, liveness, admin_state, inventory_hash = row
    return NodeCard(node_id, secret_digest, liveness, admin_state, inventory_hash, generation)


def proven(node_id: str, secret: str, generation: int = 0) -> NodeCard | None:
    """The node's card as the database has it if `secret` proves the node's token; None otherwise.

    The heartbeat's action asks for it (`inventory.heartbeat.Sender`) when Redis has no current card.
    """
    card = from_database(node_id, generation)
    if card is None or not digest_matches(secret, card.secret_digest):
        return None
    return card


def _on_event(sender, instance: NodeEvent, **kwargs) -> None:
    invalidate(instance.node_id)


def _on_token(sender, instance: NodeToken, **kwargs) -> None:
    invalidate(instance.node_id)


def _on_node_deleted(sender, instance: Node, **kwargs) -> None:
    invalidate(instance.pk)


def connect_receivers() -> None:
    """Invalidate a node's cached cards whenever what they hold changes; called once by the app."""
    post_save.connect(_on_event, sender=NodeEvent, dispatch_uid="nodecards-event")
    post_save.connect(_on_token, sender=NodeToken, dispatch_uid="nodecards-token-saved")
    post_delete.connect(_on_token, sender=NodeToken, dispatch_uid="nodecards-token-deleted")
    post_delete.connect(_on_node_deleted, sender=Node, dispatch_uid="nodecards-node-deleted")
