"""Each node's shard list, cached in Redis under the shard versions it was read at.

Every web worker answers every node, so the list is kept where all of them
share it. `inventory.desired` builds the list from the database and decides
when a cached one still holds; this module stores and reads it. A heartbeat
that changes nothing reads it in the beat script's round trip instead
(livestate.beatscript).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence

import msgspec
import redis

import livestate
from agent import protocol
from livestate import keeping, keys, shardversion

log = logging.getLogger(__name__)

# Only a backstop for a version bump lost to a Redis outage; every node reading
# the database this often costs a 10,000-node fleet about 30 queries a second.
CACHE_TTL_SECONDS = 300
# How often every node's list is stored afresh (livestate.keeping): well under the shortest expiry
# drawn, so that a kept list never expires between two keepings.
KEEP_PERIOD_SECONDS = 60


def expiry() -> int:
    """Seconds a list cached now is kept (livestate.keeping.drawn_expiry)."""
    return keeping.drawn_expiry(CACHE_TTL_SECONDS)


class ReplicaName(msgspec.Struct, array_like=True):
    replica_id: str


class ShardFacts(msgspec.Struct, array_like=True):
    """What the domain compares of a shard with the agent's reports (the same attribute names as `Shard`)."""

    shard_id: str
    state: str
    reason: str
    metrics_port: int
    replica: ReplicaName


class CachedShards(msgspec.Struct, array_like=True):
    version: tuple[int, int]
    shards: list[ShardFacts]
    specs: list[protocol.ShardSpec]
    # Required, not defaulted: a list cached before engines were part of it fails to
    # decode and is read again, rather than telling the agent to forget its installs.
    engines: list[protocol.EngineWant]


_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(CachedShards)


def decode(raw: bytes | None, version: tuple[int, int]) -> CachedShards | None:
    """The cached list if `raw` holds one stored under `version`; else None."""
    if raw is None:
        return None
    try:
        cached = _decoder.decode(raw)
    except msgspec.DecodeError:
        return None
    if tuple(cached.version) != version:
        return None
    return cached


def read(node_id: str) -> tuple[tuple[int, int] | None, bytes | None]:
    """The node's shard version and its cached list, in one round trip; (None, None) if Redis is down."""
    try:
        pipe = livestate.client().pipeline(transaction=False)
        shardversion.queue_read(pipe, node_id)
        pipe.get(keys.node_shards(node_id))
        versions, raw = pipe.execute()
    except redis.RedisError:
        return None, None
    return shardversion.parse(versions), raw


def encode(cached: CachedShards) -> bytes:
    """The list as it is stored (livestate/heartbeats.py stores it in its own script call)."""
    return _encoder.encode(cached)


def store(node_id: str, cached: CachedShards) -> None:
    """Cache the list; losing it to a Redis outage costs only a database read later."""
    try:
        livestate.client().set(keys.node_shards(node_id), encode(cached), ex=expiry())
    except redis.RedisError as exc:
        log.warning("shards of %s not cached: %s", node_id, exc)


def keep(
    node_ids: Callable[[], Sequence[str]],
    build: Callable[[Sequence[str], Sequence[tuple[int, int]]], Mapping[str, CachedShards]],
) -> int | None:
    """Store every node's list afresh when due (livestate.keeping); how many, or None when not due.

    `build(node_ids, versions)` reads every node's list from the database, each to be
    cached under its version, which is fetched before the read: a change committed
    meanwhile has moved it, so the list stored is stale rather than wrong. A node
    `build` leaves out keeps what it has. Raises redis errors.
    """
    return keeping.when_due(
        keys.SHARD_LISTS_KEPT, KEEP_PERIOD_SECONDS, lambda client: _store_all(client, node_ids(), build)
    )


def _store_all(
    client: redis.Redis,
    ids: Sequence[str],
    build: Callable[[Sequence[str], Sequence[tuple[int, int]]], Mapping[str, CachedShards]],
) -> int:
    versions = shardversion.read_many(client, ids)
    built = list(build(ids, versions).items())
    for chunk in keeping.batches(built):
        entries = {keys.node_shards(node_id): _encoder.encode(entry) for node_id, entry in chunk}
        keeping.store(client, entries, CACHE_TTL_SECONDS)
    return len(built)


def forget() -> None:
    """Drop every cached shard list (tests start each case from the database)."""
    try:
        client = livestate.client()
        found = list(client.scan_iter(match=keys.NODE_SHARDS_PREFIX + "*", count=1000))
        if found:
            client.delete(*found)
    except redis.RedisError:
        pass
