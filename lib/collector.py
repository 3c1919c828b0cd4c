"""Python's cyclic garbage collector, paused around work that makes many objects without cycles.

Reference counting frees such objects (rows, byte strings, cached entries) as
soon as they are dropped; the cyclic collector would only walk them, and every
other object of the process, over and over. A full collection in a web worker
walks the whole heap while holding the interpreter: some 50-110 ms under load
on the 2-core machine, during which that worker answers nothing. Two uses:
a `/metrics` scrape (nodes/metrics/exposition.py) and the refill after Redis
lost its data (inventory.refill).

The pause is counted, so that two overlapping pauses in one process (two threads)
restore the collector only when the last ends, and never turn on a collector
that was off before the first began.
"""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterator
from contextlib import contextmanager

_lock = threading.Lock()
_pauses = 0
_was_enabled = False


@contextmanager
def paused() -> Iterator[None]:
    """No cyclic collection while the block runs (in any thread of the process); restored however it ends."""
    global _pauses, _was_enabled
    with _lock:
        if _pauses == 0:
            _was_enabled = gc.isenabled()
            gc.disable()
        _pauses += 1
    try:
        yield
    finally:
        with _lock:
            _pauses -= 1
            if _pauses == 0 and _was_enabled:
                gc.enable()


def freeze_loaded() -> None:
    """Leave every object made so far out of all later collections (a server's code, settings, templates).

    Called once a web worker has loaded the application: what loading made lives
    as long as the process, and a full collection then walks only what was made
    since (docs/operations.md, "The collector in the web workers").
    """
    gc.collect()
    gc.freeze()
