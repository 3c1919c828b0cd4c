"""Counters in Redis that move whenever what a node's agent should run may have changed.

Each node's shard list is cached in Redis under the counters it was read at
(`livestate.shardlists`, used by `inventory.desired`) and read from the database
again only when that node's counter (or the counter of every node, moved when a
deployment changes) has moved: an unchanged heartbeat reads no row, and a change on one node sends
only that node's agent back to the database.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence

import redis
from django.db import transaction
from redis.client import Pipeline

import livestate
from livestate import keeping, keys

log = logging.getLogger(__name__)

EVERY_NODE = "*"


def bump(node_ids: Iterable[str | None] | None = None) -> None:
    """Move the counters of these nodes (None: of every node), now and once the transaction commits.

    Now, so that a change is seen at once where there is no transaction to
    wait for; after the commit too, so that a reader who cached the old rows
    under the first number in between reads them again.
    """
    fields = [EVERY_NODE] if node_ids is None else sorted({n for n in node_ids if n})
    if not fields:
        return
    _incr(fields)
    if transaction.get_connection().in_atomic_block:
        transaction.on_commit(lambda: _incr(fields))


def _incr(fields: list[str]) -> None:
    try:
        pipe = livestate.client().pipeline(transaction=False)
        for name in fields:
            pipe.hincrby(keys.SHARD_VERSIONS, name, 1)
        pipe.execute()
    except redis.RedisError as exc:
        log.warning("could not bump the shard versions: %s", exc)


def queue_read(pipe: Pipeline, node_id: str) -> None:
    """Queue the read of the node's counter and every node's on a pipeline; `parse` reads the answer."""
    pipe.hmget(keys.SHARD_VERSIONS, [node_id, EVERY_NODE])


def read_many(client: redis.Redis, node_ids: Sequence[str]) -> list[tuple[int, int]]:
    """Each node's counter and every node's, as `parse` gives them, in one round trip (a command a batch)."""
    everyone, *mine = keeping.read_batched(
        client, [EVERY_NODE, *node_ids], lambda pipe, chunk: pipe.hmget(keys.SHARD_VERSIONS, list(chunk))
    )
    return [(int(own or 0), int(everyone or 0)) for own in mine]


def parse(answer: list[bytes | None]) -> tuple[int, int]:
    mine, everyone = answer
    return int(mine or 0), int(everyone or 0)
