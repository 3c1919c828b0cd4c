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

from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, TypeVar

import redis
from redis.client import Pipeline

import livestate

# Rows read, and keys stored, at a time: well inside SQLite's and PostgreSQL's parameter limits.
BATCH = 500

# Each key set with its own expiry, a batch in one command. redis-py packs and parses a
# pipelined SET in Python, some 20 µs each: 10,000 of them were most of a keeping's
# 0.2-0.3 s, the time a Redis that lost its data stays cold (inventory.refill).
_STORE = """
for i, key in ipairs(KEYS) do
  redis.call('SET', key, ARGV[2 * i - 1], 'EX', ARGV[2 * i])
end
return #KEYS
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


def store(client: redis.Redis, entries: Mapping[str, bytes], expiry: Callable[[], int]) -> None:
    """Set each key to its value, each for `expiry()` seconds drawn afresh, in one call. Raises redis errors."""
    if not entries:
        return
    args: list[bytes | int] = []
    for value in entries.values():
        args += (value, expiry())
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
