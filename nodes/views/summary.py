"""The fleet at a glance, for the top of the cluster page.

Node counts by state are one cheap GROUP BY and are always current. The CPU,
RAM and GPU totals need every node's load and every GPU, which at 10,000 nodes
costs more than a refresh should; they are computed by whichever request finds
them missing and shared through Redis for TOTALS_MAX_AGE seconds (the page's
own refresh period), so all workers and all operators share one computation.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import cast

import msgspec
import redis
from django.db.models import Count

import livestate
from inventory.models import GPU, Node, NodeState, free_q, state_q
from livestate import keys, loadstore
from nodes.loads import REDIS_DOWN

log = logging.getLogger(__name__)

TOTALS_KEY = keys.FLEET_TOTALS
TOTALS_MAX_AGE = 5.0


class GPUClassCount(msgspec.Struct, array_like=True):
    gpu_class: str
    free: int
    total: int


class FleetTotals(msgspec.Struct):
    """What the whole fleet is using, from every fresh load, and its GPUs by class."""

    computed_at: float
    reporting: int = 0
    cores_busy: float = 0.0
    cores_total: int = 0
    memory_used: int = 0
    memory_total: int = 0
    gpus: list[GPUClassCount] = []
    load_known: bool = True


_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(FleetTotals)


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


def gpus_by_class() -> list[GPUClassCount]:
    """Free and total GPUs per class; a GPU is free when healthy and claimed by no shard."""
    rows = (
        GPU.objects.order_by()
        .values("gpu_class")
        .annotate(total=Count("id"), free=Count("id", filter=free_q()))
        .order_by("gpu_class")
    )
    return [GPUClassCount(row["gpu_class"], row["free"], row["total"]) for row in rows]


def compute_totals(now: float) -> FleetTotals:
    """Sum every fresh load (one query for the ids, one MGET); raises redis errors."""
    ids = list(Node.objects.values_list("id", flat=True))
    totals = FleetTotals(computed_at=now)
    for load in loadstore.fetch_figures(ids, now).values():
        totals.reporting += 1
        totals.cores_busy += load.cpu_percent / 100 * load.cpus
        totals.cores_total += load.cpus
        totals.memory_used += load.memory_used_bytes
        totals.memory_total += load.memory_used_bytes + load.memory_available_bytes
    totals.gpus = gpus_by_class()
    return totals


def fleet_totals(now: float) -> tuple[FleetTotals, str | None]:
    """The shared totals if fresh enough, else computed now and shared."""
    client = livestate.client()
    try:
        raw = cast(bytes | None, client.get(TOTALS_KEY))
        if raw is not None:
            try:
                return _decoder.decode(raw), None
            except msgspec.DecodeError:
                pass
        totals = compute_totals(now)
        client.set(TOTALS_KEY, _encoder.encode(totals), px=int(TOTALS_MAX_AGE * 1000))
        return totals, None
    except redis.RedisError as exc:
        log.warning("cluster summary without loads: %s", exc)
        return FleetTotals(computed_at=now, gpus=gpus_by_class(), load_known=False), REDIS_DOWN


def summary(now: float | None = None) -> Summary:
    now = now if now is not None else time.time()
    total, states = state_counts()
    totals, problem = fleet_totals(now)
    return Summary(total=total, states=states, totals=totals, problem=problem)
