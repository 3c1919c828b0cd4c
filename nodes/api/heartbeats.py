"""A heartbeat: which node sent it, and everything it changes.

The ordinary heartbeat of a live node with an unchanged inventory costs one
Redis round trip and no database access: `beatscript` admits it (limits,
token), notes its time, stores its load and reads the node's shard list in one
call; its self-metrics go out with this process's others once a second
(`selfmetrics.Tally`). The database is written only when something changed: a new
inventory, or an agent's report that moves a shard. A node coming back to life
costs no more: its time is noted like any other, it is answered as alive at
once, and the sweep's flush revives it with the others in bulk. While Redis
is down the same heartbeat is answered from the database, its time (and a
revival) written there directly and its load dropped.
"""

from __future__ import annotations

import logging
import re
import time
from dataclasses import dataclass
from datetime import UTC, datetime

import msgspec
import redis
from django.conf import settings

import livestate
from agent import protocol
from inventory import desired, liveness
from inventory.models import Liveness, Node, derive_state
from inventory.registration import upsert_inventory
from livestate import beatscript, cards, heartbeats, limits, loadstore, selfmetrics, sweeprecord
from livestate.cards import NodeCard
from llmgw_site.logs import OccasionalWarning
from nodes import ratelimit
from nodes.api.cards import from_database
from nodes.api.rejections import Rejected
from nodes.models import digest_matches, split_token

log = logging.getLogger(__name__)

_NODE_ID = re.compile(protocol.NodeId.__metadata__[0].pattern)

# Redis being down is logged at most once per 30 s per process, not once per heartbeat.
_warn_redis_down = OccasionalWarning(log, 30.0)
REDIS_DOWN = "Redis unavailable, heartbeats go to the database and their loads are dropped: %s"
# This process's count of ordinary heartbeats, sent once a second.
_tally = selfmetrics.Tally()
# This process's note that heartbeats are arriving, for the sweep to tell the control plane's outages.
_pulse = sweeprecord.Pulse()


@dataclass
class Caller:
    """The node a request's token proves, and what the heartbeat path knows of it."""

    card: NodeCard
    # The card came from Redis, current: no need to store it again.
    cached: bool
    redis_up: bool
    # The beat script has already applied the heartbeat and read the node's shards.
    applied: bool = False
    shard_version: tuple[int, int] | None = None
    cached_shards: bytes | None = None


def unauthorized(reason: str = "unknown or revoked node token") -> Rejected:
    return Rejected(401, "Authorization", reason, "unauthorized")


def authenticate(
    token: str,
    address: str,
    received_at: float,
    beat: protocol.Heartbeat | None = None,
) -> Caller:
    """The node whose token this is, or a 401 or 429: nothing in the body can name another node.

    With the heartbeat given, an ordinary one is applied in the same round trip (`Caller.applied`).
    """
    node_id, secret = split_token(token)
    if len(node_id) > protocol.MAX_ID or not _NODE_ID.fullmatch(node_id):
        raise unauthorized("not a node token")
    apply = beat is not None and beat.inventory is None
    load = loadstore.render(node_id, beat.load, received_at) if apply and beat.load is not None else None
    try:
        verdict = beatscript.run(node_id, secret, token, address, received_at, apply, load)
    except redis.RedisError as exc:
        _warn_redis_down(REDIS_DOWN, exc)
        return Caller(_card_from_database(node_id, secret), cached=False, redis_up=False)
    match verdict.outcome:
        case beatscript.LOCKED:
            remaining = limits.seconds_left(received_at)
            raise Rejected(429, "authorization", ratelimit.TOO_MANY_REFUSED, "rate_limited", remaining)
        case beatscript.RATE:
            limit = settings.LLMGW_HEARTBEAT_PER_MINUTE
            reason = f"more than {limit} heartbeats with this token per minute"
            raise Rejected(429, "rate", reason, "rate_limited", limits.seconds_left(received_at))
        case beatscript.UNAUTHORIZED:
            raise unauthorized()
        case beatscript.STALE:
            card = _card_from_database(node_id, secret, verdict.generation)
            return Caller(card, cached=False, redis_up=True)
    return Caller(
        verdict.card,
        cached=True,
        redis_up=True,
        applied=verdict.outcome == beatscript.APPLIED,
        shard_version=verdict.shard_version,
        cached_shards=verdict.cached_shards,
    )


def _card_from_database(node_id: str, secret: str, generation: int = 0) -> NodeCard:
    card = from_database(node_id, generation)
    if card is None or not digest_matches(secret, card.secret_digest):
        raise unauthorized()
    return card


def receive_heartbeat(caller: Caller, beat: protocol.Heartbeat, received_at: float, started: float):
    """Apply a valid heartbeat of the caller's node; returns the reply to send.

    `received_at` is the arrival time on the control plane's clock (the agent's
    `sent_at` is never used for ages); `started` is the perf_counter reading when
    handling began, for the handling-time histogram.
    """
    card = caller.card
    if caller.applied:
        specs = desired.from_cache(card.node_id, caller.shard_version, caller.cached_shards, beat.shards)
        if specs is None:
            specs = desired.sync_node(card.node_id, beat.shards, version=caller.shard_version)
        _tally.add(selfmetrics.heartbeat_fields("accepted", time.perf_counter() - started))
        _pulse.accepted(received_at)
        return heartbeat_reply(_as_revived(card), beat, specs)
    at = datetime.fromtimestamp(received_at, UTC)
    store_card = not caller.cached
    if beat.inventory is not None:
        upsert_inventory(card.node_id, beat.inventory, beat.inventory_hash, now=at)
        card.inventory_hash = beat.inventory_hash
        store_card = True
    written = False
    if caller.redis_up:
        try:
            pipe = livestate.client().pipeline(transaction=False)
            # Noted like any heartbeat, even a node's coming back to life: the sweep's flush revives it.
            heartbeats.note(pipe, card.node_id, received_at)
            if beat.load is not None:
                loadstore.save(card.node_id, beat.load, received_at, pipe)
            if store_card:
                cards.store(pipe, card)
            selfmetrics.add(pipe, selfmetrics.heartbeat_fields("accepted", time.perf_counter() - started))
            pipe.execute()
            written = True
            _pulse.accepted(received_at)
        except redis.RedisError as exc:
            _warn_redis_down(REDIS_DOWN, exc)
    if not written:
        # Redis is down: the heartbeat, and a node's coming back to life, go to the database at once.
        liveness.touch(Node(pk=card.node_id, liveness=card.liveness), at)
    specs = desired.sync_node(card.node_id, beat.shards, use_cache=caller.redis_up)
    return heartbeat_reply(_as_revived(card), beat, specs)


def _as_revived(card: NodeCard) -> NodeCard:
    """The card as it will be once the heartbeat is applied: alive, its admin state untouched.

    An unreachable or lost node's heartbeat is noted in Redis, and the next
    flush (a few seconds away) writes its revival; the node is told now.
    """
    if card.liveness == Liveness.ALIVE:
        return card
    return msgspec.structs.replace(card, liveness=Liveness.ALIVE)


def heartbeat_reply(
    card: NodeCard, beat: protocol.Heartbeat, shards: list[protocol.ShardSpec]
) -> protocol.HeartbeatReply:
    """What the node is told: its displayed state, when to beat next, whether to send its inventory,
    and exactly the shards it should run (placement decides them; the agent's reports of its
    shards move them through starting and running)."""
    return protocol.HeartbeatReply(
        state=derive_state(card.admin_state, card.liveness),
        heartbeat_interval=settings.LLMGW_HEARTBEAT_INTERVAL,
        # An empty hash claims nothing; a different one means the node has changed.
        inventory_wanted=beat.inventory is None and beat.inventory_hash not in ("", card.inventory_hash),
        shards=shards,
    )


def count_rejection(outcome: str, started: float) -> None:
    selfmetrics.record(selfmetrics.heartbeat_fields(outcome, time.perf_counter() - started))
