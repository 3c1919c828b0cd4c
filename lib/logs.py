"""A warning said at most once per period: an outage hit by every request must not write a line per request."""

from __future__ import annotations

import logging
import time


class OccasionalWarning:
    """Logs through `logger` at most once every `every` seconds (per process); the rest are dropped."""

    def __init__(self, logger: logging.Logger, every: float):
        self.logger = logger
        self.every = every
        self.last = float("-inf")

    def __call__(self, message: str, *args) -> bool:
        """Log the warning if its period has passed; returns whether it was logged."""
        now = time.monotonic()
        if now - self.last < self.every:
            return False
        self.last = now
        self.logger.warning(message, *args)
        return True

    def reset(self) -> None:
        """Let the next warning through (tests start each case afresh)."""
        self.last = float("-inf")
