"""The control plane's own counters, shared by every web and Celery process.

Kept in one Redis hash rather than in each process's memory: the web server runs
several workers and Celery another, and a scrape reaches only one of them.
Writers add their increments to a pipeline they already send (the heartbeat
path costs no extra round trip); /metrics reads the hash in the same round
trip as the loads. Besides the counters, the hash keeps one gauge, each proxy
clock's offset from a web host's with when it was learnt (two fields a pair,
set, not added to; `record_proxy_clock`).
"""

from __future__ import annotations

import logging
import math
import time

import redis
from redis import Redis
from redis.client import Pipeline

import livestate
from livestate import keys

log = logging.getLogger(__name__)


# Upper bounds (seconds) of the heartbeat handling-time histogram.
HEARTBEAT_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)


# Upper bounds (seconds) of the histogram of accepted heartbeats' waits in the proxy for a web worker:
# around LLMGW_BEHIND_AFTER (1 s) and up to the agents' own timeout.
PROXY_WAIT_BUCKETS = (0.001, 0.005, 0.025, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
# Field prefixes of each proxy clock's offset from a web host's, and when it was learnt (nodes.api.proxyclock).
PROXY_CLOCK_OFFSET = "proxy_clock:offset:"
PROXY_CLOCK_AT = "proxy_clock:at:"


def bucket_field(bound: float, histogram: str = "heartbeat_seconds") -> str:
    """The field counting a histogram's values in (previous bound, bound]; /metrics makes them cumulative."""
    return f"{histogram}:le:+Inf" if math.isinf(bound) else f"{histogram}:le:{bound}"


def heartbeat_fields(outcome: str, seconds: float, waited: float | None = None) -> dict[str, float]:
    """The increments one handled heartbeat makes: outcome is "accepted" or a rejection reason.

    `waited`: its wait in the proxy, when known (a proxy in front), counted in a histogram of its own.
    """
    fields: dict[str, float] = {
        f"heartbeats:{outcome}": 1,
        "heartbeat_seconds:count": 1,
        "heartbeat_seconds:sum": seconds,
    }
    bound = next((bound for bound in HEARTBEAT_BUCKETS if seconds <= bound), math.inf)
    fields[bucket_field(bound)] = 1
    if waited is not None:
        fields["proxy_wait_seconds:sum"] = waited
        bound = next((bound for bound in PROXY_WAIT_BUCKETS if waited <= bound), math.inf)
        fields[bucket_field(bound, "proxy_wait_seconds")] = 1
    return fields


def record_proxy_clock(proxy: str, host: str, offset: float, at: float) -> None:
    """Keep a proxy clock's offset from a web host's (names checked by the caller); Redis down loses it."""
    pair = f"{proxy}/{host}"
    try:
        livestate.client().hset(
            keys.SELF_METRICS, mapping={PROXY_CLOCK_OFFSET + pair: repr(offset), PROXY_CLOCK_AT + pair: repr(at)}
        )
    except redis.RedisError as exc:
        log.warning("proxy clock offset not recorded: %s", exc)


def proxy_clocks(counters: dict[str, float], since: float) -> dict[tuple[str, str], float]:
    """(proxy, web host) → offset, of the offsets learnt since `since` (Unix seconds)."""
    offsets = {}
    for field, value in counters.items():
        if field.startswith(PROXY_CLOCK_OFFSET):
            pair = field.removeprefix(PROXY_CLOCK_OFFSET)
            if counters.get(PROXY_CLOCK_AT + pair, 0.0) >= since:
                proxy, _, host = pair.partition("/")
                offsets[(proxy, host)] = value
    return offsets


def sweep_fields(
    unreachable: int, lost: int, failed: int, held_back: bool = False, revived: int = 0, graced: bool = False
) -> dict[str, float]:
    """The increments one run of the stale-marking task makes.

    `held_back`: it marked no node lost because most of the fleet was
    unreachable; such a sweep counts once, however many nodes it held.
    `revived`: nodes its flush brought back to life. `graced`: it marked
    nothing, in the grace period after the control plane's own outage.
    """
    return {
        "sweeps": 1,
        "swept:unreachable": unreachable,
        "swept:lost": lost,
        "swept:alive": revived,
        "swept:failed": failed,
        "swept:held": int(held_back),
        "swept:graced": int(graced),
    }


def sweep_skipped_fields() -> dict[str, float]:
    """The increment of a stale-marking task that did not sweep (another was running, or Redis was down)."""
    return {"sweeps:skipped": 1}


def add(pipe: Pipeline | Redis, fields: dict[str, float]) -> None:
    """Queue increments on a pipeline (or client); integers stay integers."""
    for name, value in fields.items():
        if isinstance(value, int) and not name.endswith(":sum"):
            pipe.hincrby(keys.SELF_METRICS, name, int(value))
        else:
            pipe.hincrbyfloat(keys.SELF_METRICS, name, value)


def as_script_args(fields: dict[str, float]) -> list[str | float | int]:
    """The increments as a script's arguments ("int" or "float", field, amount each), by `add`'s rule.

    livestate/recordscript.lua applies them; integers stay integers there too.
    """
    args: list[str | float | int] = []
    for name, value in fields.items():
        if isinstance(value, int) and not name.endswith(":sum"):
            args += ("int", name, int(value))
        else:
            args += ("float", name, repr(float(value)))
    return args


def record(fields: dict[str, float]) -> None:
    """Send increments on their own; losing them when Redis is down is acceptable."""
    try:
        pipe = livestate.client().pipeline(transaction=False)
        add(pipe, fields)
        pipe.execute()
    except redis.RedisError as exc:
        log.warning("self-metrics not recorded: %s", exc)


class Tally:
    """Increments this process holds and sends together, at most once every `every` seconds.

    The ordinary heartbeat is counted here rather than in its own round trip:
    at thousands of heartbeats a second that saves Redis four commands each,
    for one round trip per worker per second. When heartbeats are a second or
    more apart (a small fleet) each is sent at once. Counts lag by up to
    `every` while heartbeats flow, and a worker that stops loses at most that
    much of them.
    """

    def __init__(self, every: float = 1.0):
        self.every = every
        self.pending: dict[str, float] = {}
        self.sent_at = float("-inf")

    def add(self, fields: dict[str, float]) -> None:
        for name, amount in fields.items():
            self.pending[name] = self.pending.get(name, 0) + amount
        now = time.monotonic()
        if now - self.sent_at >= self.every:
            self.sent_at = now
            pending, self.pending = self.pending, {}
            record(pending)


def read(raw: dict[bytes, bytes]) -> dict[str, float]:
    """Decode the hash as read by HGETALL."""
    values = {}
    for name, value in raw.items():
        number = float(value)
        if math.isfinite(number):
            values[name.decode()] = number
    return values


def queue_read(pipe: Pipeline) -> None:
    """Queue the read of every counter on a pipeline the caller sends anyway; `read` decodes the answer."""
    pipe.hgetall(keys.SELF_METRICS)
