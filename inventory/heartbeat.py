"""A heartbeat: the one action that receives it and owns everything it changes.

The web layer reads the request, checks that the bearer token is shaped like a
node's (nodes/api/views.py, served straight from WSGI by nodes/api/fastpath.py),
decodes the body, and calls `receive` once; it turns a `Refused` into its HTTP
answer. Everything else happens here:

- **admission, in one Redis round trip.** `livestate.beatscript` counts the
  token against its limit, checks its secret against the node's cached card,
  refuses a heartbeat older than one already received from the same agent run,
  and, for a heartbeat without an inventory, notes its time, stores its load
  and reads the node's shard list. That includes an unreachable or lost node:
  the sweep's flush revives every node whose time it finds (inventory.liveness),
  so the node is answered as alive at once and no row is read or written.
- **the database, only on change.** A card that is missing or stale is read
  from the database (through the web app's tokens, which prove the secret), a
  new inventory is stored (`inventory.registration`), GPU error evidence is
  judged (`inventory.gpuhealth`), and an agent's report that moves a shard is
  applied (`inventory.desired`). What the script did not write then goes to
  Redis in one script call (`livestate.heartbeats.record`).
- **the reply**: the node's shown state, the interval, the shards it should run
  and the engines to install for them.

While Redis is down the same heartbeat is answered from the database, its time
(and a revival) written there directly and its load dropped.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime

import msgspec
import redis
from django.conf import settings

from agent import protocol
from inventory import desired, gpuhealth, liveness, refill
from inventory.models import Liveness, Node, derive_state
from inventory.registration import ReplayedInventory, as_ip, upsert_inventory
from lib.logs import OccasionalWarning
from livestate import beatscript, heartbeats, limits, loadstore, selfmetrics, sequence, sweeprecord
from livestate.cards import NodeCard
from livestate.shardlists import CachedShards

log = logging.getLogger(__name__)

# Redis being down is logged at most once per 30 s per process, not once per heartbeat.
_warn_redis_down = OccasionalWarning(log, 30.0)
REDIS_DOWN = "Redis unavailable, heartbeats go to the database and their loads are dropped: %s"
# This process's count of ordinary heartbeats, sent once a second.
_tally = selfmetrics.Tally()
# This process's note that heartbeats are arriving, for the sweep to tell the control plane's outages.
_pulse = sweeprecord.Pulse()


@dataclass(frozen=True)
class Sender:
    """Who a heartbeat's token says sent it; nothing in the body can name another node."""

    node_id: str
    secret: str
    # The whole token: its heartbeats are counted under its digest, never under the token itself.
    token: str
    # Where the request came from (nodes/ratelimit.py): a wrong secret is counted against it,
    # and a new inventory records it as where the node is (nodes/targets.py).
    address: str
    # The node's card as the database has it when `secret` proves the node's token, else None.
    # The tokens are the web app's (nodes/api/cards.py); it is asked only when Redis has no current card.
    card_from_database: Callable[[str, str, int], NodeCard | None]
    # Stores every node's card afresh (the web app's keeping, nodes/api/cards.py): started at once when Redis
    # has lost its data (inventory.refill).
    keep_cards: Callable[[], int | None]


class Refused(Exception):
    """A heartbeat that changes nothing; the web layer says why in its answer."""


class WrongToken(Refused):
    def __init__(self, counted: bool):
        super().__init__("unknown or revoked node token")
        # The beat script counts a secret it finds wrong against the address itself;
        # one found wrong in the database is still to be counted.
        self.counted = counted


class TooManyWrongTokens(Refused):
    """A wrong secret from an address that has spent this minute's budget of them (counted)."""


class TooManyHeartbeats(Refused):
    """More heartbeats with this token this minute than LLMGW_HEARTBEAT_PER_MINUTE."""

    def __init__(self, retry_after: int):
        super().__init__(f"too many heartbeats; retry in {retry_after} s")
        self.retry_after = retry_after


class Replayed(Refused):
    """A heartbeat no newer than one already received from the same agent run."""

    def __init__(self, seq: int, newest: int):
        super().__init__(f"heartbeat {seq} is not newer than {newest}")
        self.seq = seq
        self.newest = newest


@dataclass
class _Admitted:
    """The node a heartbeat's token proved, and how much of the heartbeat the admission already did."""

    card: NodeCard
    # The card came from Redis, current: no need to store it again.
    cached: bool
    redis_up: bool
    # The beat script has noted the heartbeat and stored its load.
    applied: bool = False
    # The node's shard version and cached list as the beat script read them (applied or stale).
    shard_version: tuple[int, int] | None = None
    cached_shards: bytes | None = None
    # The load as rendered for the beat script, stored with the rest when the script could not apply it.
    load: loadstore.RenderedLoad | None = None


def admit(sender: Sender, received_at: float) -> None:
    """Check a heartbeat's token and limits only (raises `Refused`): its body could not be read.

    Only the node itself may learn what is wrong with its heartbeat.
    """
    _admit(sender, received_at, None)


def receive(
    sender: Sender, beat: protocol.Heartbeat, received_at: float, started: float, waited: float | None = None
) -> protocol.HeartbeatReply:
    """Apply a valid heartbeat of the sender's node and return what the node must do (raises `Refused`).

    `received_at` is the arrival time on the control plane's clock (the agent's
    `sent_at` is never used for ages); `started` is the perf_counter reading when
    handling began, for the handling-time histogram; `waited` is how long the
    request had waited in the proxy for a web worker, None if unknown (no proxy in front).
    """
    admitted = _admit(sender, received_at, beat)
    card = admitted.card
    if beat.inventory is not None:
        _store_inventory(sender, beat, beat.inventory, received_at)
        card.inventory_hash = beat.inventory_hash
    # GPU error evidence is rare and goes to the database; it may fail a replica,
    # so the shard list the script read is not trusted after it.
    evidence = gpuhealth.shows_evidence(beat.load)
    if evidence and beat.load is not None:
        gpuhealth.observe(card.node_id, beat.load.gpus, datetime.fromtimestamp(received_at, UTC))
    orders = _orders(admitted, beat, evidence)
    counts = selfmetrics.heartbeat_fields("accepted", time.perf_counter() - started, waited)
    if admitted.applied:
        _tally.add(counts)
        noted = True
    else:
        noted = _record(admitted, card, beat, received_at, counts, orders.to_cache)
    if noted:
        _pulse.accepted(received_at, waited or 0.0)
    return heartbeat_reply(_as_revived(card), beat, orders)


def count_refused(outcome: str, started: float) -> None:
    """Count a heartbeat that was answered with a refusal (`outcome` is its short reason)."""
    selfmetrics.record(selfmetrics.heartbeat_fields(outcome, time.perf_counter() - started))


def _admit(sender: Sender, received_at: float, beat: protocol.Heartbeat | None) -> _Admitted:
    """The node the sender's token proves; with the heartbeat given, an ordinary one is applied in the same call."""
    node_id = sender.node_id
    apply = beat is not None and beat.inventory is None
    load = None
    if beat is not None and apply and beat.load is not None:
        load = loadstore.render(node_id, beat.load, received_at)
    boot_id, seq = (beat.boot_id, beat.seq) if beat is not None else ("", 0)
    try:
        verdict = beatscript.run(
            node_id, sender.secret, sender.token, sender.address, received_at, apply, load, boot_id, seq
        )
    except redis.RedisError as exc:
        _warn_redis_down(REDIS_DOWN, exc)
        return _Admitted(_proven_card(sender), cached=False, redis_up=False)
    match verdict.outcome:
        case beatscript.APPLIED if verdict.card is not None:
            return _Admitted(
                verdict.card,
                cached=True,
                redis_up=True,
                applied=True,
                shard_version=verdict.shard_version,
                cached_shards=verdict.cached_shards,
            )
        case beatscript.CARD if verdict.card is not None:
            return _Admitted(verdict.card, cached=True, redis_up=True)
        case beatscript.STALE:
            if verdict.cards_lost:
                refill.after_loss(sender.keep_cards)
            card = _proven_card(sender, verdict.generation)
            # The script could not check the token, so it left the sequence alone: now it is proven.
            newest = _advance_sequence(node_id, boot_id, seq)
            if newest is not None:
                raise Replayed(seq, newest)
            return _Admitted(
                card,
                cached=False,
                redis_up=True,
                shard_version=verdict.shard_version,
                cached_shards=verdict.cached_shards,
                load=load,
            )
        case beatscript.LOCKED:
            raise TooManyWrongTokens()
        case beatscript.RATE:
            raise TooManyHeartbeats(limits.seconds_left(received_at))
        case beatscript.REPLAYED:
            raise Replayed(seq, verdict.newest_seq)
        case beatscript.UNAUTHORIZED:
            raise WrongToken(counted=True)
    raise ValueError(f"the beat script answered {verdict.outcome!r}")


def _proven_card(sender: Sender, generation: int = 0) -> NodeCard:
    card = sender.card_from_database(sender.node_id, sender.secret, generation)
    if card is None:
        raise WrongToken(counted=False)
    return card


def _advance_sequence(node_id: str, boot_id: str, seq: int) -> int | None:
    try:
        return sequence.advance(node_id, boot_id, seq)
    except redis.RedisError as exc:
        # Redis failed between two calls: the database still refuses an old inventory.
        _warn_redis_down(REDIS_DOWN, exc)
        return None


def _store_inventory(
    sender: Sender, beat: protocol.Heartbeat, inventory: protocol.Inventory, received_at: float
) -> None:
    try:
        upsert_inventory(
            sender.node_id,
            inventory,
            beat.inventory_hash,
            now=datetime.fromtimestamp(received_at, UTC),
            boot_id=beat.boot_id,
            seq=beat.seq,
            source_addr=as_ip(sender.address),
        )
    except ReplayedInventory as exc:
        raise Replayed(beat.seq, exc.stored_seq) from None


def _orders(admitted: _Admitted, beat: protocol.Heartbeat, evidence: bool) -> desired.Orders:
    node_id = admitted.card.node_id
    # The beat script's read of the shards, unless a new inventory stored since or GPU evidence
    # may have failed a replica.
    if admitted.shard_version is not None and beat.inventory is None and not evidence:
        orders = desired.from_cache(node_id, admitted.shard_version, admitted.cached_shards, beat.shards)
        if orders is not None:
            return orders
        # Cached with the rest of what the script did not write, when there is any.
        return desired.orders(node_id, beat.shards, version=admitted.shard_version, defer_cache=not admitted.applied)
    return desired.orders(node_id, beat.shards, use_cache=admitted.redis_up)


def _record(
    admitted: _Admitted,
    card: NodeCard,
    beat: protocol.Heartbeat,
    received_at: float,
    counts: dict[str, float],
    shards: CachedShards | None,
) -> bool:
    """Write what the beat script did not (time, load, card, shard list, count); whether Redis took them.

    Noted like any heartbeat, even a node's coming back to life: the sweep's
    flush revives it. While Redis is down the time, and a revival, go to the
    database at once.
    """
    if admitted.redis_up:
        changed_card = None if admitted.cached and beat.inventory is None else card
        load = admitted.load
        if load is None and beat.load is not None:
            load = loadstore.render(card.node_id, beat.load, received_at)
        try:
            heartbeats.record(card.node_id, received_at, load, changed_card, counts, shards)
            return True
        except redis.RedisError as exc:
            _warn_redis_down(REDIS_DOWN, exc)
    # A cached card's liveness may be older than the database's (NodeCard.liveness); one just read is not.
    known = card.liveness if not admitted.cached else _liveness_in_database(card.node_id)
    if known is not None:
        liveness.touch(Node(pk=card.node_id, liveness=known), datetime.fromtimestamp(received_at, UTC))
    return False


def _liveness_in_database(node_id: str) -> str | None:
    found = Node.objects.filter(pk=node_id).values_list("liveness", flat=True).first()
    return None if found is None else str(found)


def _as_revived(card: NodeCard) -> NodeCard:
    """The card as it will be once the heartbeat is applied: alive, its admin state untouched.

    An unreachable or lost node's heartbeat is noted in Redis, and the next
    flush (a few seconds away) writes its revival; the node is told now. So
    whatever liveness the card says, cached or not, the reply is the same: that
    is why changes of liveness leave cached cards current.
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
