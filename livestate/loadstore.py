"""The latest load of every node, kept in Redis, never in the database.

A load describes a moment; a restored one would be stale. Each node has two
keys, written together: its latest load with the time it arrived on the
control plane's clock (for the pages), and the same load already rendered as
/metrics sample lines (livestate.loadlines), so that a scrape of the whole
fleet reads ready text instead of formatting every sample again. Readers
fetch many nodes in round trips of MGET_BATCH keys and must treat a load older than
LLMGW_LOAD_MAX_AGE as unknown, never as the last value: `is_fresh` is that
rule, for every reader (pages, API, admin, /metrics and its pre-render), and
`decode` the only reading of the stored format.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import NamedTuple, TypeVar, cast

import msgspec
from django.conf import settings
from redis.client import Pipeline

import livestate
from agent.protocol import Load
from livestate import keys
from livestate import loadlines as load_lines


def is_fresh(received_at: float, now: float, margin: float = 0.0) -> bool:
    """Whether a load that arrived at `received_at` may still be shown at `now`.

    `margin`: how much longer the caller's answer is kept (a pre-rendered
    /metrics), so that no load older than LLMGW_LOAD_MAX_AGE is ever served.
    """
    return received_at >= fresh_since(now, margin)


def fresh_since(now: float, margin: float = 0.0) -> float:
    """The oldest arrival time `is_fresh` accepts at `now`: readers of many loads compare with it directly."""
    max_age: float = settings.LLMGW_LOAD_MAX_AGE
    return now - max(max_age - margin, 0.0)


class StoredLoad(msgspec.Struct, frozen=True):
    received_at: float
    load: Load

    def age(self, now: float | None = None) -> float:
        return (now if now is not None else time.time()) - self.received_at

    def is_fresh(self, now: float | None = None) -> bool:
        return is_fresh(self.received_at, now if now is not None else time.time())


class LoadFigures(msgspec.Struct):
    """The few figures of a stored load that totals and sorting need."""

    cpu_percent: float
    cpus: int
    load1: float = 0.0
    memory_used_bytes: int = 0
    memory_available_bytes: int = 0

    @property
    def memory_fraction(self) -> float:
        total = self.memory_used_bytes + self.memory_available_bytes
        return self.memory_used_bytes / total if total else 0.0


class StoredFigures(msgspec.Struct):
    """A stored load read for its figures only: without its per-shard list, reading 10,000 is several times cheaper."""

    received_at: float
    load: LoadFigures


Stored = TypeVar("Stored", StoredLoad, StoredFigures)

_encoder = msgspec.msgpack.Encoder()
_decoders = {shape: msgspec.msgpack.Decoder(shape) for shape in (StoredLoad, StoredFigures)}


def decode(raw: bytes, shape: type[Stored]) -> Stored | None:
    """A stored load, whole or its figures only; None if it cannot be read (written by another version)."""
    try:
        return cast(Stored, _decoders[shape].decode(raw))
    except msgspec.DecodeError:
        return None


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


def save(node_id: str, load: Load, received_at: float, pipe: Pipeline | None = None) -> None:
    """Store a node's load and its /metrics lines; both expire once nobody may show them."""
    target = pipe if pipe is not None else livestate.client().pipeline(transaction=False)
    expiry = expiry_seconds()
    rendered = render(node_id, load, received_at)
    target.set(keys.load(node_id), rendered.encoded, ex=expiry)
    target.set(keys.load_lines(node_id), rendered.lines, ex=expiry)
    if pipe is None:
        target.execute()


# Keys one MGET reads. Redis runs a command whole before it answers anyone else: one MGET of a
# 10,000-node fleet's /metrics lines (2.5 KB a node) held a client beside it for up to 21-24 ms;
# MGETs of 500, for 2-3 ms, the whole read taking no longer (`python -m bench.fleetlib.redis_reads`,
# docs/operations.md, "Big reads held Redis").
MGET_BATCH = 500


def _read_many(names: list[str]) -> list[bytes | None]:
    """Many keys' values, in round trips of MGET_BATCH keys, so that heartbeats are answered between them."""
    client = livestate.client()
    found: list[bytes | None] = []
    for start in range(0, len(names), MGET_BATCH):
        found.extend(cast(list[bytes | None], client.mget(names[start : start + MGET_BATCH])))
    return found


def read_lines(node_ids: list[str]) -> list[bytes | None]:
    """Many nodes' /metrics lines (raises redis errors); `loadlines.parse` reads each."""
    return _read_many([keys.load_lines(i) for i in node_ids])


def fetch(node_ids: Iterable[str], fresh_only: bool = True, now: float | None = None) -> dict[str, StoredLoad]:
    """Latest loads for many nodes (raises redis errors)."""
    return _fetch(node_ids, StoredLoad, fresh_only, now if now is not None else time.time())


def fetch_figures(node_ids: Iterable[str], now: float) -> dict[str, LoadFigures]:
    """The fresh loads' figures for many nodes (raises redis errors)."""
    return {node_id: stored.load for node_id, stored in _fetch(node_ids, StoredFigures, True, now).items()}


def _fetch(node_ids: Iterable[str], shape: type[Stored], fresh_only: bool, now: float) -> dict[str, Stored]:
    ids = list(node_ids)
    if not ids:
        return {}
    found: dict[str, Stored] = {}
    # is_fresh's rule, its cutoff read once rather than once a node.
    oldest = fresh_since(now) if fresh_only else float("-inf")
    stored_loads = _read_many([keys.load(i) for i in ids])
    for node_id, raw in zip(ids, stored_loads, strict=True):
        stored = decode(raw, shape) if raw is not None else None
        if stored is None or stored.received_at < oldest:
            continue
        found[node_id] = stored
    return found
