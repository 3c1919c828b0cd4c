"""The agent API while the database is down: a 503 the agent retries, never a 500.

An ordinary heartbeat of a live node needs no database (nodes/api/heartbeats.py),
so a fleet keeps beating through a database restart. What does need it (any
registration; a heartbeat whose node card is not cached, that brings a node
back to life, carries an inventory or a shard report that moves a shard) is
refused with a Retry-After until the database answers again.
"""

from __future__ import annotations

import logging

from django.db import DatabaseError, DataError, IntegrityError, connection

from lib.logs import OccasionalWarning
from nodes.api.rejections import Rejected

log = logging.getLogger(__name__)

# About one heartbeat interval: a restarting database is usually back within a few.
RETRY_AFTER_SECONDS = 5
# The outage is logged at most once per 30 s per process, not once per request.
warn_unavailable = OccasionalWarning(log, 30.0)


def is_outage(exc: DatabaseError) -> bool:
    """Whether the error means the database could not be used, rather than that it refused what was written.

    Django draws the same line (only these two leave the connection known to
    work): a DataError or an IntegrityError is a fault of the request or of
    our code, and stays a 500 with its traceback rather than pass for an outage.
    """
    return not isinstance(exc, DataError | IntegrityError)


def database_unavailable(exc: DatabaseError) -> Rejected:
    """The refusal of a request that needed the database while it could not be used.

    A connection the error broke is closed, so that the next request connects
    afresh rather than failing on the dead one.
    """
    _close_if_broken()
    warn_unavailable("database unavailable, agent requests that need it are answered 503: %s", exc)
    return Rejected(
        503, "database", "the control plane's database is unavailable; retry later", "unavailable", RETRY_AFTER_SECONDS
    )


def _close_if_broken() -> None:
    # Django checks this too when a request finishes, but only where a WSGI
    # server sends that signal; here it does not depend on it. Inside a
    # transaction the connection is its owner's to undo.
    if not connection.in_atomic_block:
        connection.close_if_unusable_or_obsolete()
