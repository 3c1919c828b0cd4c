"""What the stale sweep needs to tell the nodes' silence from the control plane's own.

Three facts, kept in Redis: when any process last accepted a heartbeat, and
when one last accepted a heartbeat that had waited longer than
LLMGW_BEHIND_AFTER in the proxy for a web worker (`Pulse`, written by the web
tier at most once a second per process each), and the sweep's own record
(`SweepRecord`: when it last ran to the end, until when the fleet has a grace
period, and whether the last run found the whole fleet quiet).
`inventory.sweep` reads them before it sweeps and writes the record after;
what they mean is decided there.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import redis
from django.conf import settings

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


@dataclass(frozen=True)
class Backlog:
    """The latest heartbeat accepted after waiting longer than LLMGW_BEHIND_AFTER for a web worker."""

    # Its arrival at the web worker (Unix seconds).
    at: float
    # How long it had waited in the proxy, in seconds.
    waited: float


@dataclass(frozen=True)
class Heard:
    """What the web tier has told the sweep, and the sweep's own record."""

    record: SweepRecord
    # The last time any process accepted a heartbeat (Unix seconds); None: none on record.
    accepted_at: float | None
    backlog: Backlog | None


def read() -> Heard:
    """The sweep's record and what the web tier noted of the heartbeats it accepted; raises redis errors."""
    pipe = livestate.client().pipeline(transaction=False)
    pipe.hgetall(keys.SWEEP_RECORD)
    pipe.get(keys.ACCEPTED_AT)
    pipe.get(keys.BEHIND_AT)
    raw, accepted, behind = pipe.execute()
    record = SweepRecord(
        swept_at=float(raw[b"swept_at"]) if b"swept_at" in raw else None,
        grace_until=float(raw.get(b"grace_until", 0.0)),
        quiet=raw.get(b"quiet") == b"1",
    )
    return Heard(record, float(accepted) if accepted is not None else None, _backlog(behind))


def _backlog(raw: bytes | None) -> Backlog | None:
    at, _, waited = (raw or b"").partition(b" ")
    try:
        return Backlog(at=float(at), waited=float(waited))
    except ValueError:
        return None


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
    """This process's notes that heartbeats are being accepted, and that they waited for it: each at most once a second.

    One SET a second per web worker, whatever the rate of heartbeats (two while
    heartbeats wait): cheap enough to need no pipeline of its own. Processes
    overwrite each other's notes, so a stored one may lag the latest by up to a
    second; the sweep's thresholds are several seconds.
    """

    def __init__(self, every: float = 1.0):
        self.every = every
        self.sent_at: float | None = None
        self.behind_sent_at: float | None = None

    def accepted(self, received_at: float, waited: float = 0.0) -> None:
        """Note a heartbeat accepted at `received_at` (Unix seconds) after `waited` seconds in the proxy.

        A Redis error is logged, not raised.
        """
        if waited > settings.LLMGW_BEHIND_AFTER and self._due(self.behind_sent_at, received_at):
            self.behind_sent_at = received_at
            self._note(keys.BEHIND_AT, f"{received_at!r} {waited!r}")
        if self._due(self.sent_at, received_at):
            self.sent_at = received_at
            self._note(keys.ACCEPTED_AT, repr(received_at))

    def reset(self) -> None:
        """Send the next notes whatever their time (tests empty Redis between heartbeats a second apart)."""
        self.sent_at = None
        self.behind_sent_at = None

    def _due(self, sent_at: float | None, received_at: float) -> bool:
        return sent_at is None or abs(received_at - sent_at) >= self.every

    @staticmethod
    def _note(key: str, value: str) -> None:
        try:
            livestate.client().set(key, value)
        except redis.RedisError as exc:
            log.warning("the sweep's note of accepted heartbeats (%s) not recorded: %s", key, exc)
