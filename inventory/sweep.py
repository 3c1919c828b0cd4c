"""The stale sweep as beat runs it: one at a time, and never blaming the nodes for the control plane's own outage.

`inventory.liveness.mark_stale` holds the rules of a node's silence; this
module decides when they may be applied. Two things make silence the control
plane's fault rather than the nodes':

- **No heartbeat accepted anywhere** for longer than `outage_gap()` (two
  heartbeat intervals or two beat periods, whichever is longer), while the
  fleet has at least two live nodes: the web tier, its proxy or its network is
  down, or the whole fleet fell silent at the same moment, which is far less
  likely. While it lasts the sweep marks nobody. `LLMGW_DISRUPTION_THRESHOLD=1`
  turns this off with the rule it extends (docs/operations.md).
- **The sweep did not run** for longer than `outage_gap()`, or has no record
  of ever running (Redis new, restarted empty, or flushed): heartbeats may
  have gone unrecorded (a flush backlog, Redis's hash lost), and the sweep
  cannot tell which.
- **The control plane is behind on its heartbeats**: within `outage_gap()` a
  heartbeat was accepted after waiting longer than LLMGW_BEHIND_AFTER in the
  proxy for a web worker (the time the proxy took it, its `X-Request-Start`,
  against the worker's clock; nodes/api/views.py). Heartbeats then queue,
  and the agents' own timeouts drop some of them: a node whose last few were
  dropped looks silent though it beat on time. An overloaded web tier, a
  fleet coming back all at once, a stall of the host: whatever the cause, it
  is the control plane's. `LLMGW_DISRUPTION_THRESHOLD=1` turns this off too.

After any of them, once the control plane is back, the fleet gets one grace period
of `LLMGW_UNREACHABLE_AFTER` in which nobody is marked unreachable or lost;
heartbeats arriving meanwhile revive their nodes as usual. A node still
silent when it ends is marked as before.

While Redis is down the sweep does not run at all: it can neither take its
lock nor know whether heartbeats are arriving, and the web tier is then on its
slow path, writing each heartbeat to the database. When Redis is back, the
gap in the sweep's record gives the grace period.

Sweeps never overlap: each holds a lock in Redis (`livestate.locks`), and one
that finds it taken skips. Overlapping sweeps would be safe (every change is
a compare-and-set) but the second would mostly redo the first's work, and
during an outage's recovery that work is largest.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime

import redis
from django.conf import settings
from django.utils import timezone

from inventory.liveness import MIN_DISRUPTED_NODES, SweepResult, mark_stale
from inventory.models import Liveness, Node
from lib.logs import OccasionalWarning
from livestate import locks, sweeprecord
from livestate.sweeprecord import Backlog, SweepRecord

log = logging.getLogger(__name__)

# A sweep takes well under two seconds at 10,000 nodes; the lock expires on
# its own if a worker dies holding it, so the next beat is never blocked long.
SWEEP_LOCK_SECONDS = 60

# A grace period beginning is logged at most once a minute per process.
warn_grace = OccasionalWarning(log, 60.0)
warn_skipped = OccasionalWarning(log, 60.0)


@dataclass
class Outcome:
    """A run of the sweep: its result, or why it did not sweep."""

    result: SweepResult | None = None
    # Set when the sweep did not run: another held the lock, or Redis was down.
    skipped: str | None = None
    # Why the fleet is in a grace period that this run began or extended, if it did.
    grace_reason: str | None = None


def outage_gap() -> float:
    """Seconds without a heartbeat accepted anywhere, or without a sweep, that count as the control plane's outage.

    Twice the longer of the heartbeat interval and the beat period: a fleet of
    two or more nodes never goes that long without a heartbeat, nor beat that
    long without a sweep, while the control plane works.
    """
    return 2 * max(settings.LLMGW_HEARTBEAT_INTERVAL, settings.LLMGW_BEAT_PERIOD)


def judge(
    now: float,
    record: SweepRecord,
    accepted_at: float,
    fleet_can_fall_quiet: Callable[[], bool],
    backlog: Backlog | None = None,
) -> tuple[SweepRecord, str | None]:
    """The record this run leaves, with its grace period, and why a grace period began or went on (None: it did not).

    `fleet_can_fall_quiet` is asked only when no heartbeat has been accepted
    for the outage gap: whether the fleet is large enough for that to be the
    control plane's fault rather than its only node's. `backlog` is the latest
    heartbeat that waited too long for a web worker, if any is on record.
    """
    gap = outage_gap()
    reasons = []
    if record.swept_at is None:
        reasons.append("no earlier sweep on record")
    elif now - record.swept_at > gap:
        reasons.append(f"no sweep ran for {now - record.swept_at:.0f} s")
    quiet = now - accepted_at > gap and fleet_can_fall_quiet()
    if quiet:
        reasons.append(f"no heartbeat accepted anywhere for {now - accepted_at:.0f} s")
    elif record.quiet:
        reasons.append("heartbeats are accepted again")
    if backlog is not None and now - backlog.at <= gap and disruption_rules_on():
        reasons.append(
            f"the control plane is behind on its heartbeats: one waited {backlog.waited:.1f} s "
            f"for a web worker {max(now - backlog.at, 0):.0f} s ago"
        )
    grace_until = record.grace_until
    if reasons:
        grace_until = max(grace_until, now + settings.LLMGW_UNREACHABLE_AFTER)
    return SweepRecord(swept_at=now, grace_until=grace_until, quiet=quiet), "; ".join(reasons) or None


def disruption_rules_on() -> bool:
    """Whether the sweep may blame the control plane for a silence; LLMGW_DISRUPTION_THRESHOLD=1 turns that off."""
    return settings.LLMGW_DISRUPTION_THRESHOLD < 1


def fleet_can_fall_quiet() -> bool:
    """Whether a fleet with no heartbeat at all is more likely the control plane's fault than the nodes'.

    Not for a single live node (its silence is its own), nor when the
    disruption rule is turned off (LLMGW_DISRUPTION_THRESHOLD=1).
    """
    if not disruption_rules_on():
        return False
    return Node.objects.filter(liveness=Liveness.ALIVE).count() >= MIN_DISRUPTED_NODES


def run(now: datetime | None = None) -> Outcome:
    """Sweep once, unless another sweep is running or Redis is down; honour the control plane's grace period."""
    now = now or timezone.now()
    try:
        lock = locks.sweep_lock(SWEEP_LOCK_SECONDS)
        acquired = lock.acquire()
    except redis.RedisError as exc:
        warn_skipped("stale sweep skipped, Redis is unavailable: %s", exc)
        return Outcome(skipped="Redis unavailable")
    if not acquired:
        return Outcome(skipped="another sweep is running")
    try:
        return _run_locked(now)
    finally:
        try:
            lock.release()
        except redis.exceptions.LockError:
            log.warning("stale sweep lock expired before the sweep ended")
        except redis.RedisError as exc:
            log.warning("stale sweep lock not released (it expires in %d s): %s", SWEEP_LOCK_SECONDS, exc)


def _run_locked(now: datetime) -> Outcome:
    seconds = now.timestamp()
    try:
        heard = sweeprecord.read()
        record, accepted_at = heard.record, heard.accepted_at
        if accepted_at is None:
            # Redis knows of no heartbeat: count the fleet's silence from now.
            sweeprecord.start_counting(seconds)
            accepted_at = seconds
    except redis.RedisError as exc:
        warn_skipped("stale sweep skipped, Redis is unavailable: %s", exc)
        return Outcome(skipped="Redis unavailable")
    record, reason = judge(seconds, record, accepted_at, fleet_can_fall_quiet, heard.backlog)
    if reason:
        warn_grace(
            "no node is marked unreachable or lost before %s (LLMGW_UNREACHABLE_AFTER after the control plane's "
            "own outage or backlog): %s",
            datetime.fromtimestamp(record.grace_until, UTC).isoformat(timespec="seconds"),
            reason,
        )
    result = mark_stale(now, datetime.fromtimestamp(record.grace_until, UTC))
    try:
        # Only a sweep that ran to the end is recorded: one that raised leaves
        # a gap, and the next gives the fleet its grace period.
        sweeprecord.write(record)
    except redis.RedisError as exc:
        log.warning("stale sweep's record not kept: %s", exc)
    return Outcome(result=result, grace_reason=reason)
