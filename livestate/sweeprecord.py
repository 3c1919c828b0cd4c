"""What the stale sweep needs to tell the nodes' silence from the control plane's own.

Two facts, kept in Redis: when any process last accepted a heartbeat
(`Pulse`, written by the web tier at most once a second per process), and the
sweep's own record (`SweepRecord`: when it last ran to the end, until when
the fleet has a grace period, and whether the last run found the whole fleet
quiet). `inventory.sweep` reads both before it sweeps and writes the record
after; what they mean is decided there.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import redis

import livestate
from livestate import keys

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SweepRecord:
    # Unix seconds of the sweep's last run to the end; None: no record (never, or Redis lost it).
    swept_at: float | None = None
    # Before this (Unix seconds) the sweep marks no node unreachable or lost.
    grace_until: float = 0.0
    # The last run found no heartbeat accepted anywhere for too long.
    quiet: bool = False


def read() -> tuple[SweepRecord, float | None]:
    """The sweep's record and the last time a heartbeat was accepted (None: none on record); raises redis errors."""
    pipe = livestate.client().pipeline(transaction=False)
    pipe.hgetall(keys.SWEEP_RECORD)
    pipe.get(keys.ACCEPTED_AT)
    raw, accepted = pipe.execute()
    record = SweepRecord(
        swept_at=float(raw[b"swept_at"]) if b"swept_at" in raw else None,
        grace_until=float(raw.get(b"grace_until", 0.0)),
        quiet=raw.get(b"quiet") == b"1",
    )
    return record, float(accepted) if accepted is not None else None


def write(record: SweepRecord) -> None:
    """Store the record of a sweep that ran to the end (raises redis errors)."""
    livestate.client().hset(
        keys.SWEEP_RECORD,
        mapping={
            "swept_at": repr(record.swept_at),
            "grace_until": repr(record.grace_until),
            "quiet": "1" if record.quiet else "0",
        },
    )


def start_counting(now: float) -> None:
    """Count the fleet's silence from `now` if no heartbeat is on record (Redis new or emptied); raises redis errors."""
    livestate.client().set(keys.ACCEPTED_AT, repr(now), nx=True)


class Pulse:
    """This process's note that heartbeats are being accepted, sent at most once a second.

    One SET a second per web worker, whatever the rate of heartbeats: cheap
    enough to need no pipeline of its own. Processes overwrite each other's
    times, so the stored one may lag the latest by up to a second; the sweep's
    thresholds are several seconds.
    """

    def __init__(self, every: float = 1.0):
        self.every = every
        self.sent_at: float | None = None

    def accepted(self, received_at: float) -> None:
        """Note a heartbeat accepted at `received_at` (Unix seconds); a Redis error is logged, not raised."""
        if self.sent_at is not None and abs(received_at - self.sent_at) < self.every:
            return
        self.sent_at = received_at
        try:
            livestate.client().set(keys.ACCEPTED_AT, repr(received_at))
        except redis.RedisError as exc:
            log.warning("time of the last accepted heartbeat not recorded: %s", exc)

    def reset(self) -> None:
        """Send the next note whatever its time (tests empty Redis between heartbeats a second apart)."""
        self.sent_at = None
