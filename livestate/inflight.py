"""Requests in flight on each replica, as the gateways see them: what a drain waits for.

Each gateway's sync (`gateway.sync`) reads its HAProxy's current sessions per server
every second and writes them here under its own name; the domain sums the gateways
that reported recently (`inventory.drainhold`). A gateway that stops reporting drops
out after REPORT_MAX_AGE, so a dead gateway never holds an engine running.
"""

from __future__ import annotations

import json
import time

import livestate
from livestate import keys

# Older reports are ignored: the sync writes every second, so this is a few missed passes.
REPORT_MAX_AGE = 5.0


def report(gateway: str, in_flight: dict[str, int], now: float | None = None) -> None:
    """Store one gateway's counts by replica id (raises redis errors: the sync logs and goes on)."""
    now = time.time() if now is None else now
    value = json.dumps({"at": now, "replicas": {name: n for name, n in in_flight.items() if n > 0}})
    livestate.client().hset(keys.GATEWAY_IN_FLIGHT, gateway, value)


def read(now: float | None = None) -> dict[str, int]:
    """Requests in flight by replica id, summed over the gateways that reported within REPORT_MAX_AGE.

    Empty when no gateway reports: a fleet without a gateway drains as it did before.
    """
    now = time.time() if now is None else now
    totals: dict[str, int] = {}
    for raw in livestate.client().hvals(keys.GATEWAY_IN_FLIGHT):
        try:
            reported = json.loads(raw)
            if now - float(reported["at"]) > REPORT_MAX_AGE:
                continue
            for name, count in reported["replicas"].items():
                totals[name] = totals.get(name, 0) + int(count)
        except (ValueError, KeyError, TypeError, AttributeError):
            continue  # a report this code cannot read holds nothing
    return totals
