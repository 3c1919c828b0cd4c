"""Loads as the pages and the operators' API show them: fresh, too old to show, or unknown because Redis is down.

Whether a load is fresh is livestate.loadstore's rule (`is_fresh`), not this module's.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime

import redis

from agent.protocol import Load
from livestate import loadstore
from livestate.loadstore import StoredLoad

log = logging.getLogger(__name__)

REDIS_DOWN = "Redis is not reachable, so current load is unknown; everything else is from the database."


@dataclass(frozen=True)
class Reading:
    """One node's latest load as of `now`. `load` is None unless it is fresh enough to show."""

    stored: StoredLoad | None
    now: float

    @property
    def age(self) -> float | None:
        return self.stored.age(self.now) if self.stored is not None else None

    @property
    def received_at(self) -> float | None:
        return self.stored.received_at if self.stored is not None else None

    @property
    def load(self) -> Load | None:
        if self.stored is None or not self.stored.is_fresh(self.now):
            return None
        return self.stored.load

    @property
    def stale(self) -> bool:
        """There is a load, but too old to show: the page says "—" and gives its age."""
        return self.stored is not None and self.load is None

    @property
    def cores_busy(self) -> float | None:
        load = self.load
        return load.cpu_percent / 100 * load.cpus if load else None

    @property
    def memory_total(self) -> int | None:
        load = self.load
        return load.memory_used_bytes + load.memory_available_bytes if load else None

    @property
    def memory_percent(self) -> float | None:
        load, total = self.load, self.memory_total
        if load is None or not total:
            return None
        return 100 * load.memory_used_bytes / total


def heartbeat_age(last_heartbeat: datetime | None, reading: Reading, now: float) -> float | None:
    """Seconds since the node was last heard from: its row's heartbeat, or its load if that is newer.

    Every heartbeat carries a load, and the load store is written on every one,
    so it can be ahead of a heartbeat time the database is told of in batches.
    """
    times = [t for t in (last_heartbeat.timestamp() if last_heartbeat else None, reading.received_at) if t is not None]
    return now - max(times) if times else None


def fetch_readings(node_ids: Iterable[str], now: float | None = None) -> tuple[dict[str, Reading], str | None]:
    """Readings for many nodes in one Redis round trip, and the problem if Redis is down."""
    ids = list(node_ids)
    now = now if now is not None else time.time()
    try:
        stored = loadstore.fetch(ids, fresh_only=False, now=now)
    except redis.RedisError as exc:
        log.warning("pages without loads: %s", exc)
        return {node_id: Reading(None, now) for node_id in ids}, REDIS_DOWN
    return {node_id: Reading(stored.get(node_id), now) for node_id in ids}, None
