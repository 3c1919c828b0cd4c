"""The latest load of every node, kept in Redis, never in the database.

A load describes a moment; a restored one would be stale. Each node has two
keys, written together: its latest load with the time it arrived on the
control plane's clock (for the pages), and the same load already rendered as
/metrics sample lines (nodes.metrics.loads), so that a scrape of the whole
fleet reads ready text instead of formatting every sample again. Readers
fetch many nodes in one round trip and must treat a load older than
LLMGW_LOAD_MAX_AGE as unknown, never as the last value.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import NamedTuple

import msgspec
import redis
from django.conf import settings

from agent.protocol import Load
from nodes.metrics import loads as load_lines

KEY_PREFIX = "llmgw:load:"
LINES_PREFIX = "llmgw:loadlines:"


class StoredLoad(msgspec.Struct, frozen=True):
    received_at: float
    load: Load

    def age(self, now: float | None = None) -> float:
        return (now if now is not None else time.time()) - self.received_at

    def is_fresh(self, now: float | None = None) -> bool:
        return self.age(now) <= settings.LLMGW_LOAD_MAX_AGE


_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(StoredLoad)

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


def lines_key(node_id: str) -> str:
    return LINES_PREFIX + node_id


def encode(load: Load, received_at: float) -> bytes:
    return _encoder.encode(StoredLoad(received_at=received_at, load=load))


class RenderedLoad(NamedTuple):
    """A load as it is stored: encoded for the pages, rendered for /metrics."""

    encoded: bytes
    lines: bytes


def render(node_id: str, load: Load, received_at: float) -> RenderedLoad:
    return RenderedLoad(encode(load, received_at), load_lines.render(node_id, load, received_at))


def expiry_seconds() -> int:
    """How long a stored load is kept: past this nobody may show it anyway."""
    return max(int(settings.LLMGW_LOAD_MAX_AGE * 2), 1)


def save(node_id: str, load: Load, received_at: float, pipe=None) -> None:
    """Store a node's load and its /metrics lines; both expire once nobody may show them."""
    target = pipe if pipe is not None else client().pipeline(transaction=False)
    expiry = expiry_seconds()
    rendered = render(node_id, load, received_at)
    target.set(key(node_id), rendered.encoded, ex=expiry)
    target.set(lines_key(node_id), rendered.lines, ex=expiry)
    if pipe is None:
        target.execute()


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
