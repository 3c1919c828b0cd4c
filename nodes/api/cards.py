"""What the heartbeat path needs to know of a node, cached in Redis.

An ordinary heartbeat must not read the database: at 2,000 heartbeats a second
that read would be most of the cost. So each node has a *card* in Redis (its
token digest, liveness, admin state and inventory hash) and a *generation*
counter. Whatever changes what a card holds bumps the node's generation; a card
remembers the generation it was read under and is used only while that is still
the current one.

Every such change records a NodeEvent (liveness, admin state, registration,
token revocation), so the receivers below bump the generation on those saves
without the code that makes the change having to know about this cache. They
bump both at once and after the transaction commits: a reader that fetched the
generation between the two read the old row, and the second bump makes its card
stale. A reader fetches the generation before it reads the database, so it can
never store an old row under a new generation.

If Redis is down when a change commits, nothing is bumped; the card's expiry is
the backstop for that case, and until then heartbeats go to the database anyway.
"""

from __future__ import annotations

import logging

import msgspec
import redis
from django.db import transaction
from django.db.models.signals import post_delete, post_save
from django.dispatch import receiver

from inventory.models import Node, NodeEvent
from nodes import loadstore
from nodes.models import NodeToken

log = logging.getLogger(__name__)

CARD_PREFIX = "llmgw:nodecard:"
GENERATION_PREFIX = "llmgw:nodegen:"
# Only a backstop (see above); long enough that re-reading every card costs the
# database a few reads a second across a 10,000-node fleet.
CARD_TTL_SECONDS = 300


class NodeCard(msgspec.Struct, array_like=True):
    node_id: str
    # Empty once the token is revoked: no secret matches it.
    secret_digest: str
    liveness: str
    admin_state: str
    inventory_hash: str
    generation: int = 0


_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(NodeCard)


def card_key(node_id: str) -> str:
    return CARD_PREFIX + node_id


def generation_key(node_id: str) -> str:
    return GENERATION_PREFIX + node_id


def decode(raw: bytes) -> NodeCard:
    return _decoder.decode(raw)


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


def store(pipe, card: NodeCard) -> None:
    """Queue the card on a pipeline the caller sends anyway."""
    pipe.set(card_key(card.node_id), _encoder.encode(card), ex=CARD_TTL_SECONDS)


def invalidate(node_id: str) -> None:
    """Make every cached card of the node stale, now and once the transaction commits."""
    _bump(node_id)
    transaction.on_commit(lambda: _bump(node_id))


def _bump(node_id: str) -> None:
    try:
        loadstore.client().incr(generation_key(node_id))
    except redis.RedisError as exc:
        log.warning("node card of %s not invalidated (it expires in %d s): %s", node_id, CARD_TTL_SECONDS, exc)


@receiver(post_save, sender=NodeEvent, dispatch_uid="nodecards-event")
def _on_event(sender, instance: NodeEvent, **kwargs) -> None:
    invalidate(instance.node_id)


@receiver(post_save, sender=NodeToken, dispatch_uid="nodecards-token-saved")
@receiver(post_delete, sender=NodeToken, dispatch_uid="nodecards-token-deleted")
def _on_token(sender, instance: NodeToken, **kwargs) -> None:
    invalidate(instance.node_id)


@receiver(post_delete, sender=Node, dispatch_uid="nodecards-node-deleted")
def _on_node_deleted(sender, instance: Node, **kwargs) -> None:
    invalidate(instance.pk)
