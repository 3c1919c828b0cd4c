"""Prometheus' answers for the pages, kept per process and asked again behind the page.

The cluster table refreshes every 5 s on every open page, and each render wants
the alerts firing and the requests waiting per node; the node and model pages
want their own. Each process keeps every answer, or the reason there is none,
and asks Prometheus again once it is MAX_AGE old. Not in the render, though: a
Prometheus busy with a large fleet's scrapes and rules (it runs at a lower
weight than the web tier) answered in hundreds of milliseconds, and the page
that happened to ask had the worst time of all (`bench.pages --beside-fleet`
at 10,000 nodes). So an answer past MAX_AGE is still served while one thread
of the process asks again, and the next render has the new one. Only a
process with no answer, or one past STALE_LIMIT (no page asked for a while),
waits for Prometheus, at most the caller's own deadline.

A failure is an answer like any other (the caller's `problem`): the page says
Prometheus is unavailable once the new answer says so.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

log = logging.getLogger(__name__)

# Alerts wait a minute or more before they fire, and the charts step by 15 s: a few seconds late shows
# nothing that matters.
MAX_AGE = 10.0
# Older than this, an answer is not shown while a new one is asked for: the render waits.
STALE_LIMIT = 60.0

THREAD_NAME = "llmgw-prometheus"

T = TypeVar("T")


class AnswerCache(Generic[T]):
    """The last answer per key and when it came, shared by the process's threads."""

    def __init__(self, max_age: float = MAX_AGE, stale_limit: float = STALE_LIMIT) -> None:
        self.max_age = max_age
        self.stale_limit = stale_limit
        self._lock = threading.Lock()
        self._answers: dict[Hashable, tuple[float, T]] = {}
        self._asking: set[Hashable] = set()

    def get(self, key: Hashable, ask: Callable[[], T]) -> T:
        now = time.monotonic()
        with self._lock:
            kept = self._answers.get(key)
            if kept is not None and now - kept[0] < self.stale_limit:
                if now - kept[0] >= self.max_age and key not in self._asking:
                    self._asking.add(key)
                    threading.Thread(target=self._ask_again, args=(key, ask), name=THREAD_NAME, daemon=True).start()
                return kept[1]
        # Two threads may both ask here; that costs one extra call, not a wrong answer.
        return self._store(key, ask())

    def _ask_again(self, key: Hashable, ask: Callable[[], T]) -> None:
        try:
            self._store(key, ask())
        except Exception:
            # `ask` turns Prometheus' failures into answers; anything else is a bug, logged, and asked again later.
            log.exception("asking Prometheus again for %r failed", key)
        finally:
            with self._lock:
                self._asking.discard(key)

    def _store(self, key: Hashable, answer: T) -> T:
        with self._lock:
            self._answers[key] = (time.monotonic(), answer)
        return answer

    def clear(self) -> None:
        with self._lock:
            self._answers.clear()
