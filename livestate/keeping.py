"""Keeping what the heartbeat path caches warm: done once a period, and at once when Redis has lost it.

Cards (livestate.cards) and shard lists (livestate.shardlists) expire as a
backstop; Celery beat stores every node's afresh from the database well within
that, so that neither expires while the control plane runs. Whether a keeping
is due is a mark in Redis that expires with its period: the first caller to
find it gone takes the keeping (SET NX), so several workers or a doubled beat
keep once, and a Redis that has lost its data has lost the mark too, so the
next beat keeps at once.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, TypeVar

import redis
from redis.client import Pipeline

import livestate

# Rows read, and keys stored, at a time: well inside SQLite's and PostgreSQL's parameter limits.
BATCH = 500

# Each key set with its own expiry, a batch in one command. redis-py packs and parses a
# pipelined SET in Python, some 20 µs each: 10,000 of them were most of a keeping's
# 0.2-0.3 s, the time a Redis that lost its data stays cold (inventory.refill). The
# expiries are spread by the script rather than drawn in Python: a draw (random.randint)
# and a packed argument a key were half of the store's Python time (23-32 ms against
# 11-14 ms at 10,000 keys). ARGV holds the values, then the shortest expiry, the number
# of seconds spread over, and where in the spread this batch starts (0 to 1); each key
# steps on by the golden ratio's fraction, which spreads any count of keys evenly.
_STORE = """
local count = #KEYS
local shortest, spread, start = tonumber(ARGV[count + 1]), tonumber(ARGV[count + 2]), tonumber(ARGV[count + 3])
for i, key in ipairs(KEYS) do
  local expiry = shortest + math.floor(((start + i * 0.6180339887498949) % 1) * spread)
  redis.call('SET', key, ARGV[i], 'EX', expiry)
end
return count
"""


def when_due(mark: str, period: int, work: Callable[[redis.Redis], int]) -> int | None:
    """`work(client)`'s count if a keeping was due under `mark`; None if the last is a period young.

    Raises redis errors.
    """
    client = livestate.client()
    if not client.set(mark, "1", nx=True, ex=period):
        return None
    try:
        return work(client)
    except Exception:
        # The next beat tries again rather than a period later.
        client.delete(mark)
        raise


def drawn_expiry(ttl: int) -> int:
    """Seconds an entry stored now is kept: drawn between half of `ttl` and all of it.

    Entries stored within one interval (a fleet's first beats, or a keeping after Redis
    lost its data) would otherwise all expire within one interval again, `ttl` later
    and every time after: the whole fleet on the cold path at once (bench.recovery).
    Drawn, the re-reads spread over half the TTL, and none is kept longer than `ttl`.
    """
    return random.randint(ttl // 2, ttl)


def store(client: redis.Redis, entries: Mapping[str, bytes], ttl: int) -> None:
    """Set each key to its value, in one call, each kept as `drawn_expiry(ttl)` would draw it. Raises redis errors."""
    if not entries:
        return
    shortest = ttl // 2
    args: list[bytes | int | float] = [*entries.values(), shortest, ttl - shortest + 1, random.random()]
    # redis-py's Script: the client's pool, so safe beside a request in a web worker (inventory.refill).
    client.register_script(_STORE)(keys=list(entries), args=args)


def read_batched(client: redis.Redis, ids: Sequence[str], queue: Callable[[Pipeline, Sequence[str]], Any]) -> list[Any]:
    """What `queue(pipe, chunk)` reads for each of `ids`, a command per batch, in one round trip.

    A batch a command keeps each command short: Redis answers no other client while it runs
    one (docs/operations.md, "Big reads held Redis"). Raises redis errors.
    """
    pipe = client.pipeline(transaction=False)
    for chunk in batches(ids):
        queue(pipe, chunk)
    return [value for answer in pipe.execute() for value in answer]


Item = TypeVar("Item")


def batches(items: Sequence[Item], size: int = BATCH) -> Iterator[Sequence[Item]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]
