"""The control plane's grace periods as the soak saw them, and what a silent node must have reached despite them.

The stale sweep marks nobody while the control plane gives the fleet a grace
period (inventory/sweep.py): after its own outage (no sweep for a while, Redis
emptied, no heartbeat anywhere) or while heartbeats queue in the proxy. That
is the control plane's rule, not a fault of the soak's: on a loaded machine a
sweep held up past the outage gap, or one heartbeat kept waiting for a web
worker, begins one. The soak reads the sweep's record in Redis twice a second
and keeps each grace period it saw, so that a node's silence is held against
the sweep only where no grace period covered it.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Graces:
    """Grace periods seen, merged where one extended another: [begun, until] in Unix seconds."""

    length: float  # LLMGW_UNREACHABLE_AFTER: a grace period is declared this long
    stretches: list[list[float]] = field(default_factory=list)

    def saw(self, now: float, grace_until: float) -> None:
        """Note the sweep record's `grace_until` read at `now`."""
        if grace_until <= now:
            return
        # Declared by a sweep `length` before it ends; seen up to a poll later.
        begun = min(now, grace_until - self.length)
        if self.stretches and begun <= self.stretches[-1][1]:
            self.stretches[-1][1] = max(self.stretches[-1][1], grace_until)
        else:
            self.stretches.append([begun, grace_until])

    def ungraced(self, start: float, end: float) -> list[tuple[float, float]]:
        """The parts of [start, end] that no grace period covered."""
        parts = []
        for begun, until in sorted(self.stretches):
            if until <= start or begun >= end:
                continue
            if begun > start:
                parts.append((start, begun))
            start = max(start, until)
        if end > start:
            parts.append((start, end))
        return parts

    def surely_crossed(self, since: float, until: float, threshold: float, margin: float) -> bool:
        """Whether a node quiet from `since` to `until` was surely swept past `threshold` seconds of silence.

        It was if, after the threshold, an ungraced stretch lasted `margin`
        (a sweep period and some slack): a sweep ran in it and was free to mark.
        """
        return any(b - a >= margin for a, b in self.ungraced(since + threshold, until))

    def summary(self, t0: float) -> dict:
        return {
            "periods_s": [[round(b - t0, 1), round(u - t0, 1)] for b, u in self.stretches],
            "seconds": round(sum(u - b for b, u in self.stretches), 1),
        }
