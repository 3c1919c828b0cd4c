"""Fair under pressure: each model's fair share per tenant, from the tenants' requests on it.

A deployment that sets `max_in_flight_per_replica` gives each of its servers that `maxconn`:
past it, requests wait in HAProxy's queue, and HAProxy takes them out lowest priority class
first, the class being how many requests the tenant already had on the model when it came
(the backend's rules, `haproxy_config.fairness_rules`). So on a saturated model a tenant with
fewer requests goes before one with more, at once, without the sync.

The sync adds, each pass, the fair share (`fair.map`, `share:bound` per backend): the model's
capacity (the maxconn of its ready servers, summed) shared max-min between the tenants with
requests on it (`show table st_fair`): a tenant asking less than an equal split keeps what it
asks, the others share what is left equally. A tenant's demand is the most it had on the model
in the last few passes, and unbounded while it is being refused (so a tenant held at its share
still counts as wanting more). A tenant with its share already on the model is refused (429):

- while others want more than is left (the share is under the capacity): at once, bound 0, so
  the model keeps room for the lighter tenants and their requests find a free slot;
- otherwise (alone, or everyone fits): once the queue holds a whole round of the capacity.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable

from gateway.haproxy_config import FAIR_REFUSALS, FAIR_TABLE, Desired, ServerState

# A tenant refused in the table's window asks more than any share.
UNBOUNDED = 1 << 30
# A tenant's demand is the most it had on the model over this many passes (seconds): a light tenant
# between two requests still holds its place.
RECENT_PASSES = 5
REFUSALS_COLUMN = FAIR_REFUSALS.replace("(10s)", "(10000)")


def demands(table: str) -> dict[str, dict[str, int]]:
    """`show table st_fair`: backend → tenant → its requests on the model now (in flight and queued), or
    UNBOUNDED for a tenant refused within the table's window."""
    found: dict[str, dict[str, int]] = {}
    for line in table.splitlines():
        fields = dict(part.split("=", 1) for part in line.split()[1:] if "=" in part)
        backend, _, tenant = fields.get("key", "").partition("/")
        current, refused = fields.get("conn_cur", "0"), fields.get(REFUSALS_COLUMN, "0")
        if not tenant or not current.isdigit() or not refused.isdigit():
            continue
        asked = UNBOUNDED if int(refused) else int(current)
        if asked:
            found.setdefault(backend, {})[tenant] = asked
    return found


class Recent:
    """Each tenant's demand on each model as the most it had in the last few passes."""

    def __init__(self, passes: int = RECENT_PASSES):
        self.samples: deque[dict[str, dict[str, int]]] = deque(maxlen=passes)

    def add(self, sample: dict[str, dict[str, int]]) -> dict[str, dict[str, int]]:
        self.samples.append(sample)
        merged: dict[str, dict[str, int]] = {}
        for each in self.samples:
            for backend, tenants in each.items():
                into = merged.setdefault(backend, {})
                for tenant, asked in tenants.items():
                    into[tenant] = max(asked, into.get(tenant, 0))
        return merged


def fair_share(capacity: int, asked: Iterable[int]) -> int:
    """The max-min fair level: tenants asking less keep what they ask, the rest share what is left equally.
    Everyone fitting, the whole capacity (nobody is over its share); never under 1."""
    ordered = sorted(asked)
    remaining, left = capacity, len(ordered)
    for wanted in ordered:
        if wanted * left > remaining:
            return max(1, remaining // left)
        remaining -= wanted
        left -= 1
    return max(1, capacity)


def command() -> str:
    return f"show table {FAIR_TABLE}"


def shares(desired: Desired, asked: dict[str, dict[str, int]]) -> dict[str, str]:
    """Backend → `share:bound` (fair.map) for each backend whose ready servers all have a maxconn: the bound is
    the queue at which a tenant with its share is refused, 0 while the share is under the capacity."""
    found = {}
    for backend in desired.backends.values():
        ready = [s for s in backend.servers if s.state == ServerState.READY]
        if not ready or not all(s.maxconn for s in ready):
            continue
        capacity = sum(s.maxconn for s in ready)
        share = fair_share(capacity, asked.get(backend.name, {}).values())
        found[backend.name] = f"{share}:{capacity if share >= capacity else 0}"
    return found
