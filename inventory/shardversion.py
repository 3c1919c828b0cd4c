"""One counter in Redis that moves whenever what some agent should run may have changed.

Web workers keep each node's shard list in memory and read the database again
only when this counter has moved (or after `MAX_AGE`), so an unchanged
heartbeat costs one Redis GET instead of a query.
"""

from __future__ import annotations

import logging

import redis
from django.db import transaction

from nodes import loadstore

log = logging.getLogger(__name__)

KEY = "llmgw:shards:version"
# A bump lost to a Redis outage is outlived by this.
MAX_AGE = 30.0


def bump() -> None:
    """Move the counter now and again once the current transaction (if any) has committed.

    Now, so that a change is seen at once where there is no transaction to
    wait for; after the commit, so that a reader who cached the old rows
    under the first number in between reads them again.
    """
    _incr()
    if transaction.get_connection().in_atomic_block:
        transaction.on_commit(_incr)


def _incr() -> None:
    try:
        loadstore.client().incr(KEY)
    except redis.RedisError as exc:
        log.warning("could not bump the shard version: %s", exc)


def current() -> int | None:
    """The counter, or None when Redis cannot say (callers then read the database)."""
    try:
        return int(loadstore.client().get(KEY) or 0)
    except redis.RedisError:
        return None
