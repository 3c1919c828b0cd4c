"""A node's card (livestate.cards) as the database has it, and the saves that make cached cards stale.

Every change of what a card holds records a NodeEvent (admin state,
registration, token revocation) or saves or deletes a NodeToken or a Node, so
the receivers below invalidate the node's cards on those saves without the code
that makes the change having to know about this cache. They are connected in
`NodesConfig.ready()`. A change of liveness leaves the cards current
(`livestate.cards.NodeCard.liveness`): a heartbeat answers its node as alive
whatever its card says, so a fleet coming back after a partition, revived by the
sweep's flush, keeps its cards.
"""

from __future__ import annotations

from functools import cache

from django.db import connection, transaction
from django.db.models.signals import post_delete, post_save

from inventory.models import Node, NodeEvent
from livestate.cards import NodeCard, invalidate, keep, store_current
from nodes.models import NodeToken, digest_matches


def from_database(node_id: str, generation: int = 0) -> NodeCard | None:
    """The node's card as the database has it; None if the node has no token.

    Read with SQL written once per process: the ORM's equivalent compiled its
    query afresh for every heartbeat whose card was not cached, which cost
    several times the rest of reading it (`python -m bench.fleetlib.profile --cold`).
    """
    with connection.cursor() as cursor:
        cursor.execute(_one_card_sql(), [node_id])
        row = cursor.fetchone()
    if row is None:
        return None
    _, secret_digest, liveness, admin_state, inventory_hash = row
    return NodeCard(node_id, secret_digest, liveness, admin_state, inventory_hash, generation)


def all_from_database() -> dict[str, NodeCard]:
    """Every node's card (of those with a token), by node id, in one query.

    One query, without a list of ids: the ids' parameters, prepared by the ORM and
    split by the driver, cost more than reading the rows (a keeping of 10,000 cards
    took 20 queries of 500 ids before, and most of its time went there).
    """
    with connection.cursor() as cursor:
        cursor.execute(_card_sql())
        return {row[0]: NodeCard(*row) for row in cursor.fetchall()}


def keep_all() -> int | None:
    """Store every node's card afresh when due (livestate.cards.keep); how many, or None when not due."""
    return keep(lambda: list(NodeToken.objects.order_by().values_list("node_id", flat=True)), all_from_database)


@cache
def _one_card_sql() -> str:
    return f"{_card_sql()} WHERE {_node_column()} = %s"


@cache
def _node_column() -> str:
    return f"t.{connection.ops.quote_name(NodeToken._meta.get_field('node').column)}"


@cache
def _card_sql() -> str:
    """The cards' query, before any condition on the node id."""
    quote = connection.ops.quote_name
    node, token = Node._meta, NodeToken._meta
    columns = ", ".join(
        [_node_column(), f"t.{quote(token.get_field('secret_digest').column)}"]
        + [f"n.{quote(node.get_field(name).column)}" for name in ("liveness", "admin_state", "inventory_hash")]
    )
    joined = f"{_node_column()} = n.{quote(node.pk.column)}"
    return f"SELECT {columns} FROM {quote(token.db_table)} t JOIN {quote(node.db_table)} n ON {joined}"


def proven(node_id: str, secret: str, generation: int = 0) -> NodeCard | None:
    """The node's card as the database has it if `secret` proves the node's token; None otherwise.

    The heartbeat's action asks for it (`inventory.heartbeat.Sender`) when Redis has no current card.
    """
    card = from_database(node_id, generation)
    if card is None or not digest_matches(secret, card.secret_digest):
        return None
    return card


def cache_after_commit(node_id: str) -> None:
    """Cache the node's card once the transaction commits, so that its next heartbeat finds it.

    A registration calls it: a fleet registering, then beating, would otherwise
    send every node's first heartbeat to the database. Run after the commit's own
    invalidations (registered before it), under the generation they leave.
    """
    transaction.on_commit(lambda: store_current(node_id, lambda generation: from_database(node_id, generation)))


def _on_event(sender, instance: NodeEvent, **kwargs) -> None:
    if instance.kind != NodeEvent.Kind.LIVENESS:
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
