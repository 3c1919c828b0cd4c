"""The drain's hold: a leaving replica's engine runs on while the gateways still have requests on it.

A replica released (its node drained, it was moved, or scaled down) is out of the
gateways at once: the sync sets its server to `drain`, so no new request reaches it.
Its shards stay in their node's desired list, so the agent keeps the engine running,
while the gateways report requests in flight on it (`livestate.inflight`) and
LLMGW_DRAIN_DEADLINE has not passed since the release; then the agent is told to stop
it. Without a gateway reporting nothing is held, as before the gateway existed.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime, timedelta

import redis
from django.conf import settings
from django.utils import timezone

from inventory.models import ReplicaState, Shard
from livestate import inflight


def deadline() -> timedelta:
    return timedelta(seconds=settings.LLMGW_DRAIN_DEADLINE)


def held(shards: Iterable[Shard], now: datetime | None = None) -> set[str]:
    """The ids of the releasing shards whose engines must keep running, for their requests in flight."""
    now = now or timezone.now()
    leaving = [s for s in shards if s.state == ReplicaState.RELEASING and s.changed_at + deadline() > now]
    if not leaving:
        return set()
    try:
        busy = inflight.read()
    except redis.RedisError:
        # Nothing known of the gateways: stop as before, as the deadline would anyway.
        return set()
    return {s.shard_id for s in leaving if busy.get(s.replica.replica_id, 0) > 0}
