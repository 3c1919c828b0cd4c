"""Fixed-window counters behind the agent API's rate limits.

The counters live in Redis, so a limit holds across every web worker and
every web machine: a per-process counter would let N workers accept N times
the limit. Windows are fixed minutes (INCR, then EXPIRE on the first hit),
which is coarse but costs one round trip. The beat script counts heartbeats on
the same keys (livestate.beatscript); which limits apply to which requests is
the web app's business (nodes/ratelimit.py).
"""

from __future__ import annotations

import time

import redis

import livestate
from livestate import keys

WINDOW = 60


def minute(now: float) -> int:
    """The number of the window `now` falls in."""
    return int(now // WINDOW)


def window_key(name: str, now: float) -> str:
    """The counter of `name` for the minute `now` falls in."""
    return keys.limit(name, minute(now))


def seconds_left(now: float) -> int:
    """Until the minute `now` falls in ends, and its counters with it."""
    return WINDOW - int(now % WINDOW)


class Limiter:
    """Fixed-window counters in Redis; by default on the client that never retries."""

    def __init__(self, client: redis.Redis | None = None):
        self._client = client

    @property
    def client(self) -> redis.Redis:
        return self._client or livestate.client(fail_fast=True)

    def hit(self, name: str, now: float | None = None) -> tuple[int, int]:
        """Count one hit; (hits in this window, seconds until it ends)."""
        now = now if now is not None else time.time()
        key, remaining = window_key(name, now), seconds_left(now)
        pipe = self.client.pipeline(transaction=False)
        pipe.incr(key)
        pipe.expire(key, WINDOW + 1, nx=True)
        count, _ = pipe.execute()
        return int(count), remaining

    def count(self, name: str, now: float | None = None) -> tuple[int, int]:
        now = now if now is not None else time.time()
        return int(self.client.get(window_key(name, now)) or 0), seconds_left(now)
