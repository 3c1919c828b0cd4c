"""Locks in Redis that keep periodic work from overlapping across workers."""

from __future__ import annotations

from redis.lock import Lock

import livestate
from livestate import keys


def reconcile_lock(timeout: float) -> Lock:
    """The lock of the reconcile pass, not yet acquired; it expires after `timeout` s if its holder dies."""
    lock: Lock = livestate.client().lock(keys.RECONCILE_LOCK, timeout=timeout, blocking=False)
    return lock


def sweep_lock(timeout: float) -> Lock:
    """The lock of the stale sweep, not yet acquired; it expires after `timeout` s if its holder dies."""
    lock: Lock = livestate.client().lock(keys.SWEEP_LOCK, timeout=timeout, blocking=False)
    return lock
