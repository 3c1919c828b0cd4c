"""How far each proxy's clock is from this host's, learnt from the proxy's health checks.

A heartbeat's wait in the proxy is this host's clock at arrival minus the
proxy's stamp, `X-Request-Start` (deploy/haproxy.cfg), and the stale sweep
marks nobody while heartbeats wait over LLMGW_BEHIND_AFTER (inventory/sweep.py).
That reading holds only while the two clocks agree. A proxy whose clock runs
behind this host's makes every heartbeat look queued, and the sweep would hold
back for as long as it lasts: a node that died would never be marked. One
running ahead hides a real backlog.

The proxy's health checks carry the same stamp and the proxy's name
(`X-LLMGW-Proxy`), but never wait in its queue: they go straight to a web
worker, behind at most the one request it is serving. So the smallest
difference a proxy's checks show over the last window or two is the clocks'
offset (plus a hop and a check's wait, milliseconds), and it is taken off every
wait measured through that proxy. A request from a client through the proxy
shows its queue on top of the offset, never less, so it cannot pull the
estimate down; only something that reaches the web workers past the proxy
could, and such a client could forge the waits themselves (LLMGW_PROXY_HOPS).

Each web worker learns on its own, from the checks it happens to answer. An
offset over half of LLMGW_BEHIND_AFTER is logged, and every offset is kept in
the self-metrics hash (one HSET a window) for /metrics
(`llmgw_proxy_clock_offset_seconds`).
"""

from __future__ import annotations

import logging
import re
import socket
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from django.conf import settings

from lib.logs import OccasionalWarning
from livestate import selfmetrics

log = logging.getLogger(__name__)

# Seconds each minimum is kept: the estimate is the smaller of this window's and the last one's,
# so a check lands in it whatever a worker's share of them, and a changed offset is followed
# within two windows.
WINDOW = 30.0
# Proxies a worker keeps estimates for; names past these share no estimate (their waits are taken as read).
MOST_PROXIES = 16
# A proxy's name as it may stand in a metric's label and a hash field.
PROXY_NAME = re.compile(r"[A-Za-z0-9._-]{1,63}")

warn_offset = OccasionalWarning(log, 300.0)


@dataclass
class _Estimate:
    window_start: float
    current: float  # smallest offset seen in this window
    previous: float | None = None  # the last window's, if it had any check

    def offset(self) -> float:
        return self.current if self.previous is None else min(self.current, self.previous)


class ProxyClocks:
    """This process's estimates of each proxy's clock offset (this host's clock minus the proxy's, in seconds)."""

    def __init__(self, window: float = WINDOW):
        self.window = window
        self.estimates: dict[str, _Estimate] = {}

    def checked(self, proxy: str, offset: float, now: float) -> None:
        """Note a health check from `proxy` that arrived `offset` seconds after the proxy's stamp."""
        estimate = self.estimates.get(proxy)
        if estimate is None:
            if len(self.estimates) >= MOST_PROXIES:
                return
            self.estimates[proxy] = estimate = _Estimate(now, offset)
            _publish(proxy, estimate.offset(), now)
            return
        if now - estimate.window_start >= self.window:
            # A window with no check (the proxy gone a while) leaves nothing to carry over.
            carried = estimate.current if now - estimate.window_start < 2 * self.window else None
            estimate.window_start, estimate.previous, estimate.current = now, carried, offset
            _publish(proxy, estimate.offset(), now)
        else:
            estimate.current = min(estimate.current, offset)

    def offset(self, proxy: str, now: float) -> float:
        """The proxy's offset as last learnt; 0 when none is (no check in the last two windows)."""
        estimate = self.estimates.get(proxy)
        if estimate is None or now - estimate.window_start >= 2 * self.window:
            return 0.0
        return estimate.offset()


_clocks = ProxyClocks()


def stamped(meta: Mapping[str, Any]) -> tuple[str, float] | None:
    """The proxy's name and its `X-Request-Start` (Unix seconds) on a request it forwarded; None without them.

    Believed only with a proxy in front (LLMGW_PROXY_HOPS): without one a client could write them.
    """
    value = meta.get("HTTP_X_REQUEST_START")
    if not value or not settings.LLMGW_PROXY_HOPS:
        return None
    try:
        proxied_at = int(value.removeprefix("t=")) / 1e6
    except ValueError:
        return None
    proxy = meta.get("HTTP_X_LLMGW_PROXY", "")
    return (proxy if PROXY_NAME.fullmatch(proxy) else ""), proxied_at


def health_checked(meta: Mapping[str, Any], received_at: float) -> None:
    """Learn from a request to /healthz, the proxy's health check (or a client's, which does no harm)."""
    stamp = stamped(meta)
    if stamp is not None:
        proxy, proxied_at = stamp
        _clocks.checked(proxy, received_at - proxied_at, received_at)


def waited_in_proxy(meta: Mapping[str, Any], received_at: float) -> float | None:
    """Seconds the request waited in our proxy before a web worker took it, its clock's offset taken off.

    None when not known: no proxy in front, or no stamp.
    """
    stamp = stamped(meta)
    if stamp is None:
        return None
    proxy, proxied_at = stamp
    return max(received_at - proxied_at - _clocks.offset(proxy, received_at), 0.0)


def forget() -> None:
    """Drop this process's estimates (tests start each case afresh)."""
    _clocks.estimates.clear()


def _publish(proxy: str, offset: float, now: float) -> None:
    if abs(offset) > settings.LLMGW_BEHIND_AFTER / 2:
        warn_offset(
            "the clock of proxy %r is %.2f s %s this host's (from its health checks); heartbeats' waits in it "
            'are corrected by that, but set both clocks by NTP (docs/operations.md, "When the control plane is '
            'behind")',
            proxy,
            abs(offset),
            "behind" if offset > 0 else "ahead of",
        )
    selfmetrics.record_proxy_clock(proxy or "unnamed", _HOST, offset, now)


_HOST = socket.gethostname() if PROXY_NAME.fullmatch(socket.gethostname()) else "unnamed"
