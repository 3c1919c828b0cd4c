"""The latest load of every node, kept in Redis, never in the database.

A load describes a moment; a restored one would be stale. Each node has two
keys, written together: its latest load with the time it arrived on the
control plane's clock (for the pages), and the same load already rendered as
/metrics sample lines (livestate.loadlines), so that a scrape of the whole
fleet reads ready text instead of formatting every sample again. Readers
fetch many nodes in one round trip and must treat a load older than
LLMGW_LOAD_MAX_AGE as unknown, never as the last value.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import NamedTuple

import msgspec
from django.conf import settings

import livestate
from agent.protocol import Load
from livestate import keys
from livestate import loadlines as load_lines


class StoredLoad(msgspec.Struct, frozen=True):
    received_at: float
    load: Load

    def age(self, now: float | None = None) -> float:
        return (now if now is not None else time.time()) - self.received_at

    def is_fresh(self, now: float | None = None) -> bool:
        return self.age(now) <= settings.LLMGW_LOAD_MAX_AGE


_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(StoredLoad)


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
    target = pipe if pipe is not None else livestate.client().pipeline(transaction=False)
    expiry = expiry_seconds()
    rendered = render(node_id, load, received_at)
    target.set(keys.load(node_id), rendered.encoded, ex=expiry)
    target.set(keys.load_lines(node_id), rendered.lines, ex=expiry)
    if pipe is None:
        target.execute()


def read_raw(node_ids: list[str]) -> list[bytes | None]:
    """The stored loads of many nodes, undecoded, in one round trip (raises redis errors).

    For readers that decode only part of a load (nodes/views/loads.py).
    """
    return livestate.client().mget([keys.load(i) for i in node_ids])


def queue_read_lines(pipe, node_ids: list[str]) -> None:
    """Queue the read of many nodes' /metrics lines on a pipeline; `loadlines.parse` reads each answer."""
    pipe.mget([keys.load_lines(i) for i in node_ids])


def fetch(node_ids: Iterable[str], fresh_only: bool = True, now: float | None = None) -> dict[str, StoredLoad]:
    """Latest loads for many nodes in one round trip (raises redis errors)."""
    ids = list(node_ids)
    if not ids:
        return {}
    now = now if now is not None else time.time()
    found = {}
    for node_id, raw in zip(ids, read_raw(ids), strict=True):
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
