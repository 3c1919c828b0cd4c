"""The heartbeat path's cache refilled at once, at full weight, after Redis lost its data.

Celery beat keeps every node's card and shard list in Redis (livestate.keeping)
and refills them within a second or two of a loss. But its worker yields the
cores to the web tier (devstack/priority.py), and a loss sends the whole
fleet's heartbeats down the cold path at once, which fills the cores: the
keepers then wait behind the very heartbeats they would spare, and the fleet
stays cold for seconds (`bench.recovery`, `redis-restart-empty`).

So a heartbeat that finds no current card and no mark of a keeping of the
cards since the loss (livestate.beatscript, `cards_lost`) starts the same two
keepings in a thread of its web worker, which runs at the web tier's weight.
Each keeping is taken once across workers and Celery by its own mark
(livestate.keeping.when_due): whoever loses that race does nothing, and a
worker starts a thread at most once every RETRY_SECONDS while the mark of the
fill is missing.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from django.conf import settings
from django.db import connection

from inventory import desired
from lib import collector

log = logging.getLogger(__name__)

# While the cards are not yet filled, each stale heartbeat would ask again; a worker tries this often at most.
RETRY_SECONDS = 1.0

_lock = threading.Lock()
_last_try = float("-inf")


def after_loss(keep_cards: Callable[[], int | None]) -> None:
    """Refill the cards (`keep_cards`, the web app's) and the shard lists in a thread, unless tried just now."""
    global _last_try
    if not settings.LLMGW_REFILL_AFTER_LOSS:
        return
    now = time.monotonic()
    with _lock:
        if now - _last_try < RETRY_SECONDS:
            return
        _last_try = now
    threading.Thread(target=refill, args=(keep_cards,), name="llmgw-refill", daemon=True).start()


def refill(keep_cards: Callable[[], int | None]) -> None:
    """The two keepings, cards first (every cold heartbeat needs its card); logged, never raised."""
    started = time.monotonic()
    try:
        # Tens of thousands of rows and entries, dropped once stored: a full collection
        # among them took a third of the refill in a loaded web worker (lib/collector.py).
        with collector.paused():
            cards = keep_cards()
            shard_lists = desired.keep_cached()
    except Exception:
        log.exception("refilling the heartbeat path's cache failed; Celery's keepers try again within a second")
        return
    finally:
        # The thread's own connection, which nothing else would close.
        connection.close()
    if cards is not None or shard_lists is not None:
        log.warning(
            "Redis had lost its data: %s node cards and %s shard lists stored again in %.2f s",
            "no" if cards is None else cards,
            "no" if shard_lists is None else shard_lists,
            time.monotonic() - started,
        )
