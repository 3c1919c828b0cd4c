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
from inventory import desired, gpuhealth, liveness
from inventory.models import Liveness, Node, derive_state
from inventory.registration import ReplayedInventory, upsert_inventory
from lib.logs import OccasionalWarning
from livestate import beatscript, cards, heartbeats, limits, loadstore, selfmetrics, sequence, sweeprecord
from livestate.cards import NodeCard
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
    # The client address the request came from: recorded with a new inventory (nodes/targets.py).
    address: str = ""
    # The beat script has already applied the heartbeat and read the node's shards.
    applied: bool = False
    shard_version: tuple[int, int] | None = None
    cached_shards: bytes | None = None


UNKNOWN_TOKEN = "unknown or revoked node token"


def unauthorized(reason: str = UNKNOWN_TOKEN) -> Rejected:
    return Rejected(401, "Authorization", reason, "unauthorized")


def authenticate(
    token: str,
    address: str,
    received_at: float,
    beat: protocol.Heartbeat | None = None,
) -> Caller:
    """The node whose token this is, or a 401 or 429: nothing in the body can name another node.

    A wrong token is counted against `address` (nodes/ratelimit.py); a right one
    is accepted whatever else that address has sent.

    With the heartbeat given, an ordinary one is applied in the same round trip (`Caller.applied`).
    """
    node_id, secret = split_token(token)
    if len(node_id) > protocol.MAX_ID or not _NODE_ID.fullmatch(node_id):
        raise ratelimit.refused_credential(address, "not a node token", received_at)
    apply = beat is not None and beat.inventory is None
    load = loadstore.render(node_id, beat.load, received_at) if apply and beat.load is not None else None
    boot_id, seq = (beat.boot_id, beat.seq) if beat is not None else ("", 0)
    try:
        verdict = beatscript.run(node_id, secret, token, address, received_at, apply, load, boot_id, seq)
    except redis.RedisError as exc:
        _warn_redis_down(REDIS_DOWN, exc)
        card = _card_from_database(node_id, secret, address, received_at)
        return Caller(card, cached=False, redis_up=False, address=address)
    match verdict.outcome:
        # The script has counted the refused secret against the address itself.
        case beatscript.LOCKED:
            raise ratelimit.locked(received_at)
        case beatscript.RATE:
            limit = settings.LLMGW_HEARTBEAT_PER_MINUTE
            reason = f"more than {limit} heartbeats with this token per minute"
            raise Rejected(429, "rate", reason, "rate_limited", limits.seconds_left(received_at))
        case beatscript.UNAUTHORIZED:
            raise unauthorized()
        case beatscript.REPLAYED:
            raise replayed(seq, verdict.newest_seq)
        case beatscript.STALE:
            card = _card_from_database(node_id, secret, address, received_at, verdict.generation)
            # The script could not check the token, so it left the sequence alone: now it is proven.
            newest = _advance_sequence(node_id, boot_id, seq)
            if newest is not None:
                raise replayed(seq, newest)
            return Caller(card, cached=False, redis_up=True, address=address)
    return Caller(
        verdict.card,
        cached=True,
        redis_up=True,
        address=address,
        applied=verdict.outcome == beatscript.APPLIED,
        shard_version=verdict.shard_version,
        cached_shards=verdict.cached_shards,
    )


def replayed(seq: int, newest: int) -> Rejected:
    """The refusal of a heartbeat no newer than one already received from the same agent run."""
    reason = f"heartbeat {seq} of this run is not newer than heartbeat {newest}, already received; nothing changed"
    return Rejected(409, "$.seq", reason, "replayed")


def _advance_sequence(node_id: str, boot_id: str, seq: int) -> int | None:
    try:
        return sequence.advance(node_id, boot_id, seq)
    except redis.RedisError as exc:
        # Redis failed between two calls: the database still refuses an old inventory.
        _warn_redis_down(REDIS_DOWN, exc)
        return None


def _card_from_database(node_id: str, secret: str, address: str, received_at: float, generation: int = 0) -> NodeCard:
    card = from_database(node_id, generation)
    if card is None or not digest_matches(secret, card.secret_digest):
        raise ratelimit.refused_credential(address, UNKNOWN_TOKEN, received_at)
    return card


def receive_heartbeat(caller: Caller, beat: protocol.Heartbeat, received_at: float, started: float):
    """Apply a valid heartbeat of the caller's node; returns the reply to send.

    `received_at` is the arrival time on the control plane's clock (the agent's
    `sent_at` is never used for ages); `started` is the perf_counter reading when
    handling began, for the handling-time histogram.
    """
    card = caller.card
    # GPU error evidence is rare and goes to the domain; it may fail a replica, so the cache is not trusted after.
    evidence = gpuhealth.shows_evidence(beat.load)
    if caller.applied and evidence:
        gpuhealth.observe(card.node_id, beat.load.gpus, datetime.fromtimestamp(received_at, UTC))
        orders = desired.orders(card.node_id, beat.shards)
        _tally.add(selfmetrics.heartbeat_fields("accepted", time.perf_counter() - started))
        _pulse.accepted(received_at)
        return heartbeat_reply(_as_revived(card), beat, orders)
    if caller.applied:
        orders = desired.from_cache(card.node_id, caller.shard_version, caller.cached_shards, beat.shards)
        if orders is None:
            orders = desired.orders(card.node_id, beat.shards, version=caller.shard_version)
        _tally.add(selfmetrics.heartbeat_fields("accepted", time.perf_counter() - started))
        _pulse.accepted(received_at)
        return heartbeat_reply(_as_revived(card), beat, orders)
    at = datetime.fromtimestamp(received_at, UTC)
    store_card = not caller.cached
    if beat.inventory is not None:
        try:
            upsert_inventory(
                card.node_id,
                beat.inventory,
                beat.inventory_hash,
                now=at,
                boot_id=beat.boot_id,
                seq=beat.seq,
                source_addr=ratelimit.as_ip(caller.address),
            )
        except ReplayedInventory as exc:
            raise replayed(beat.seq, exc.stored_seq) from None
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
    if evidence:
        gpuhealth.observe(card.node_id, beat.load.gpus, at)
    orders = desired.orders(card.node_id, beat.shards, use_cache=caller.redis_up)
    return heartbeat_reply(_as_revived(card), beat, orders)


def _as_revived(card: NodeCard) -> NodeCard:
    """The card as it will be once the heartbeat is applied: alive, its admin state untouched.

    An unreachable or lost node's heartbeat is noted in Redis, and the next
    flush (a few seconds away) writes its revival; the node is told now.
    """
    if card.liveness == Liveness.ALIVE:
        return card
    return msgspec.structs.replace(card, liveness=Liveness.ALIVE)


def heartbeat_reply(card: NodeCard, beat: protocol.Heartbeat, orders: desired.Orders) -> protocol.HeartbeatReply:
    """What the node is told: its displayed state, when to beat next, whether to send its inventory,
    exactly the shards it should run (placement decides them; the agent's reports of its
    shards move them through starting and running) and the engines to install for them."""
    return protocol.HeartbeatReply(
        state=derive_state(card.admin_state, card.liveness),
        heartbeat_interval=settings.LLMGW_HEARTBEAT_INTERVAL,
        # An empty hash claims nothing; a different one means the node has changed.
        inventory_wanted=beat.inventory is None and beat.inventory_hash not in ("", card.inventory_hash),
        shards=orders.shards,
        engines=orders.engines,
    )


def count_rejection(outcome: str, started: float) -> None:
    selfmetrics.record(selfmetrics.heartbeat_fields(outcome, time.perf_counter() - started))
