"""What the heartbeat path needs to know of a node, cached in Redis.

An ordinary heartbeat must not read the database: at 2,000 heartbeats a second
that read would be most of the cost. So each node has a *card* in Redis (its
token digest, liveness, admin state and inventory hash) and a *generation*
counter. Whatever changes what a card holds bumps the node's generation
(`invalidate`), but for liveness (see `NodeCard.liveness`); a card remembers
the generation it was read under and is used only while that is still the
current one. Building a card from the database is
the web app's business (nodes/api/cards.py), which also decides when to
invalidate.

`invalidate` bumps twice, now and after the transaction commits: a reader that
fetched the generation between the two read the old row, and the second bump
makes its card stale. A reader fetches the generation before it reads the
database, so it can never store an old row under a new generation.

If Redis is down when a change commits, nothing is bumped; the card's expiry is
the backstop for that case, and until then heartbeats go to the database anyway.

Cards are also kept: every KEEP_PERIOD_SECONDS, and at once when Redis has lost
its data, Celery stores every node's card afresh from the database in batches
(`keep`, called by nodes.tasks.keep_cards; livestate.keeping). After a loss the
first heartbeat to find no card starts the same keeping in its web worker,
which runs at full weight where Celery yields (inventory.refill). A card then never expires while the
control plane runs, so a fleet back from a partition of any length, or beating
after a Redis flush or restart, finds its cards instead of taking the cold path
all at once (bench.recovery); a change lost to a Redis outage is righted within
a period rather than the TTL.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence

import msgspec
import redis
from django.db import transaction

import livestate
from livestate import keeping, keys

log = logging.getLogger(__name__)

# Only a backstop (see above); long enough that re-reading every card costs the
# database a few reads a second across a 10,000-node fleet.
CARD_TTL_SECONDS = 300
# How often every card is stored afresh; well under the shortest expiry drawn (half the TTL),
# so that a kept card never expires between two keepings.
KEEP_PERIOD_SECONDS = 60


def expiry() -> int:
    """Seconds a card stored now is kept (livestate.keeping.drawn_expiry)."""
    return keeping.drawn_expiry(CARD_TTL_SECONDS)


class NodeCard(msgspec.Struct, array_like=True):
    # The beat script reads these by position (livestate/beatscript.lua): append, never reorder.
    node_id: str
    # Empty once the token is revoked: no secret matches it.
    secret_digest: str
    # As the database had it when the card was read: changes of liveness leave cards current
    # (a heartbeat answers its node as alive whatever this says), so only a card just read
    # from the database tells the node's liveness.
    liveness: str
    admin_state: str
    inventory_hash: str
    generation: int = 0


_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(NodeCard)


def decode(raw: bytes) -> NodeCard:
    return _decoder.decode(raw)


def encode(card: NodeCard) -> bytes:
    """The card as it is stored (livestate/heartbeats.py stores it in its own script call)."""
    return _encoder.encode(card)


def store_current(node_id: str, read: Callable[[int], NodeCard | None]) -> None:
    """Cache the node's card as `read(generation)` builds it from the database under the current generation.

    The generation is fetched first, as by every reader, so a change committed
    meanwhile leaves the stored card stale rather than wrong. Redis down: nothing
    is stored, and the node's first heartbeat reads its card as before.
    """
    try:
        client = livestate.client()
        card = read(int(client.get(keys.generation(node_id)) or 0))
        if card is not None:
            client.set(keys.card(node_id), _encoder.encode(card), ex=expiry())
    except redis.RedisError as exc:
        log.warning("node card of %s not cached (its first heartbeat reads it): %s", node_id, exc)


def keep(node_ids: Callable[[], Sequence[str]], read_all: Callable[[], Mapping[str, NodeCard]]) -> int | None:
    """Store every node's card afresh when due (livestate.keeping); how many, or None when not due.

    The generations of `node_ids()` are fetched before `read_all` reads every
    card, as `store_current` does one node's, so a change committed meanwhile
    leaves the stored card stale rather than wrong; a card of a node not among
    them (registered meanwhile, which caches its own) is left out. Raises redis errors.
    """
    return keeping.when_due(
        keys.CARDS_KEPT, KEEP_PERIOD_SECONDS, lambda client: _store_all(client, node_ids(), read_all)
    )


def _store_all(client: redis.Redis, ids: Sequence[str], read_all: Callable[[], Mapping[str, NodeCard]]) -> int:
    generations = keeping.read_batched(client, ids, lambda pipe, chunk: pipe.mget([keys.generation(n) for n in chunk]))
    found = read_all()
    stored = 0
    for chunk in keeping.batches(list(zip(ids, generations, strict=True))):
        entries = {}
        for node_id, generation in chunk:
            card = found.get(node_id)
            if card is not None:
                card.generation = int(generation or 0)
                entries[keys.card(node_id)] = _encoder.encode(card)
        keeping.store(client, entries, CARD_TTL_SECONDS)
        stored += len(entries)
    client.set(keys.CARDS_FILLED, "1")
    return stored


def invalidate(node_id: str) -> None:
    """Make every cached card of the node stale, now and once the transaction commits."""
    _bump(node_id)
    transaction.on_commit(lambda: _bump(node_id))


def _bump(node_id: str) -> None:
    try:
        livestate.client().incr(keys.generation(node_id))
    except redis.RedisError as exc:
        log.warning("node card of %s not invalidated (it expires in %d s): %s", node_id, CARD_TTL_SECONDS, exc)
