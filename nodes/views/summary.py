"""The fleet at a glance, for the top of the cluster page.

Node counts by state are one cheap pass over the table and are always current.
The CPU, RAM and GPU totals need every node's load and every GPU, which at
10,000 nodes costs more than a refresh should; they are computed ahead by
Celery beat and shared through Redis (nodes/fleetload.py), so all workers and
all operators share one computation.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

import redis
from django.db.models import Count

from inventory.models import Node, NodeState, state_q
from nodes import fleetload
from nodes.fleetload import FleetTotals
from nodes.loads import REDIS_DOWN

log = logging.getLogger(__name__)


@dataclass
class Summary:
    total: int
    states: list[tuple[NodeState, int]]
    totals: FleetTotals
    problem: str | None = None

    @property
    def cpu_percent(self) -> float | None:
        t = self.totals
        return 100 * t.cores_busy / t.cores_total if t.cores_total else None

    @property
    def memory_percent(self) -> float | None:
        t = self.totals
        return 100 * t.memory_used / t.memory_total if t.memory_total else None


def state_counts() -> tuple[int, list[tuple[NodeState, int]]]:
    """Nodes in each displayed state, in one pass over the table (cheaper than a GROUP BY)."""
    counts = Node.objects.aggregate(**{state.value: Count("pk", filter=state_q(state)) for state in NodeState})
    states = [(state, counts[state.value]) for state in NodeState]
    return sum(n for _, n in states), states


def fleet_totals(now: float) -> tuple[FleetTotals, str | None]:
    """The shared totals (nodes/fleetload.py); without Redis, the GPUs only, and the problem to show."""
    try:
        return fleetload.totals(now), None
    except redis.RedisError as exc:
        log.warning("cluster summary without loads: %s", exc)
        return FleetTotals(computed_at=now, gpus=fleetload.gpus_by_class(), load_known=False), REDIS_DOWN


def summary(now: float | None = None) -> Summary:
    now = now if now is not None else time.time()
    total, states = state_counts()
    totals, problem = fleet_totals(now)
    return Summary(total=total, states=states, totals=totals, problem=problem)
