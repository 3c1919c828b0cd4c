"""The latest load of every node, kept in Redis, never in the database.

A load describes a moment; a restored one would be stale. Each node has one
key holding its latest load, the time it arrived on the control plane's clock,
and the load already rendered as /metrics sample lines (nodes.metrics.loads), so
that a scrape of the whole fleet only joins them. Readers fetch many nodes in
one round trip and must treat a load older than LLMGW_LOAD_MAX_AGE as unknown,
never as the last value.
"""

from __future__ import annotations

import time
from collections.abc import Iterable

import msgspec
import redis
from django.conf import settings

from agent.protocol import Load, ShardLoad
from nodes.metrics import loads as load_lines

KEY_PREFIX = "llmgw:load:"


class StoredLoad(msgspec.Struct, frozen=True):
    received_at: float
    load: Load
    # One string of sample lines per family of nodes.metrics.families.NODE_LOAD.
    lines: list[str] = []

    def age(self, now: float | None = None) -> float:
        return (now if now is not None else time.time()) - self.received_at

    def is_fresh(self, now: float | None = None) -> bool:
        return self.age(now) <= settings.LLMGW_LOAD_MAX_AGE


class _Shards(msgspec.Struct):
    shards: list[ShardLoad] = []


class ScrapedLoad(msgspec.Struct):
    """What a scrape reads of a stored load: decoding skips every other field."""

    received_at: float
    lines: list[str] = []
    load: _Shards = msgspec.field(default_factory=_Shards)


_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(StoredLoad)
_scrape_decoder = msgspec.msgpack.Decoder(ScrapedLoad)

_client: redis.Redis | None = None


def client() -> redis.Redis:
    """A shared client with short timeouts: a dead Redis must not hang a request."""
    global _client
    if _client is None:
        _client = redis.Redis.from_url(
            settings.REDIS_URL, socket_timeout=1, socket_connect_timeout=1, health_check_interval=30
        )
    return _client


def reset_client() -> None:
    global _client
    _client = None


def key(node_id: str) -> str:
    return KEY_PREFIX + node_id


def encode(node_id: str, load: Load, received_at: float) -> bytes:
    return _encoder.encode(StoredLoad(received_at=received_at, load=load, lines=load_lines.render(node_id, load)))


def save(node_id: str, load: Load, received_at: float, pipe=None) -> None:
    """Store a node's load, rendered for /metrics; it expires by itself once nobody may show it."""
    target = pipe if pipe is not None else client()
    target.set(key(node_id), encode(node_id, load, received_at), ex=max(int(settings.LLMGW_LOAD_MAX_AGE * 2), 1))


def fetch(node_ids: Iterable[str], fresh_only: bool = True, now: float | None = None) -> dict[str, StoredLoad]:
    """Latest loads for many nodes in one round trip (raises redis errors)."""
    ids = list(node_ids)
    if not ids:
        return {}
    now = now if now is not None else time.time()
    found = {}
    for node_id, raw in zip(ids, client().mget([key(i) for i in ids]), strict=True):
        if raw is None:
            continue
        try:
            stored = _decoder.decode(raw)
        except msgspec.DecodeError:
            continue
        if fresh_only and not stored.is_fresh(now):
            continue
        found[node_id] = stored
    return found


def decode_for_scrape(raw: bytes | None) -> ScrapedLoad | None:
    """A stored load as /metrics needs it, or None if absent or unreadable."""
    if raw is None:
        return None
    try:
        return _scrape_decoder.decode(raw)
    except msgspec.DecodeError:
        return None
