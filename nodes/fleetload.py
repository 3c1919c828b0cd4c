"""The fleet's load at a glance, computed once and shared through Redis by every web worker.

Two things need every node's load: the cluster page's CPU, RAM and GPU totals,
and sorting the node table (page and operators' API) by CPU, RAM or load. At
10,000 nodes reading them all (one MGET, every stored load decoded) was most
of a sorted page's time, and the request that found the totals expired paid
for it again, with the GPU count by class on top (docs/operations.md, "The
cluster page while the fleet beats"). So `compute` reads them once and stores
keys with the same lifetime: the totals (small, read by every page) and, for
each figure the table sorts by, the ids of the nodes with a fresh load in
that figure's order (read only to sort by it: the sort is then a filter of a
list already in order, with no load read or decoded).

Celery beat runs `refresh` every LLMGW_FLEET_LOAD_PERIOD seconds (5, the
page's own refresh; nodes/tasks.py), and the keys live twice that, so no
request waits for the computation; one that finds a key missing (Celery not
running, Redis flushed) computes it itself. The figures are therefore up to
two periods old: the order of a table sorted by load is that of the last
computation, while each row shows its node's current load.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import cast

import msgspec
from django.conf import settings
from django.db.models import Count

import livestate
from inventory.models import GPU, Node, free_q
from livestate import keys, loadstore

TOTALS_KEY = keys.FLEET_TOTALS


def shared_seconds() -> float:
    """How long the keys live: past the next refresh, so a request never finds them gone while Celery runs."""
    period: float = settings.LLMGW_FLEET_LOAD_PERIOD
    return 2 * period


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


# The figures the node table sorts by (nodes/filtersets.py LOAD_SORTS), each read from a load.
SORT_FIGURES: dict[str, Callable[[loadstore.LoadFigures], float]] = {
    "cpu": lambda load: load.cpu_percent,
    "ram": lambda load: load.memory_fraction,
    "load": lambda load: load.load1,
}


_encoder = msgspec.msgpack.Encoder()
_totals_decoder = msgspec.msgpack.Decoder(FleetTotals)
_order_decoder = msgspec.msgpack.Decoder(list[str])


def gpus_by_class() -> list[GPUClassCount]:
    """Free and total GPUs per class; a GPU is free when healthy and claimed by no shard."""
    rows = (
        GPU.objects.order_by()
        .values("gpu_class")
        .annotate(total=Count("id"), free=Count("id", filter=free_q()))
        .order_by("gpu_class")
    )
    return [GPUClassCount(row["gpu_class"], row["free"], row["total"]) for row in rows]


def compute(now: float) -> tuple[FleetTotals, dict[str, list[str]]]:
    """Read every fresh load once (one query for the ids, one MGET): the totals, and for each
    sort figure the ids of the nodes with a fresh load, ascending by it (ties by id)."""
    ids = list(Node.objects.values_list("id", flat=True))
    totals = FleetTotals(computed_at=now)
    loads = loadstore.fetch_figures(ids, now)
    for load in loads.values():
        totals.reporting += 1
        totals.cores_busy += load.cpu_percent / 100 * load.cpus
        totals.cores_total += load.cpus
        totals.memory_used += load.memory_used_bytes
        totals.memory_total += load.memory_used_bytes + load.memory_available_bytes
    orders = {figure: _ascending(loads, read) for figure, read in SORT_FIGURES.items()}
    totals.gpus = gpus_by_class()
    return totals, orders


def _ascending(loads: dict[str, loadstore.LoadFigures], read: Callable[[loadstore.LoadFigures], float]) -> list[str]:
    """The ids ascending by one figure, ties by id (so descending is this reversed)."""
    return sorted(loads, key=lambda pk: (read(loads[pk]), pk))


def refresh(now: float | None = None) -> tuple[FleetTotals, dict[str, list[str]]]:
    """Compute them and share them for `shared_seconds()` (raises redis errors)."""
    totals, orders = compute(now if now is not None else time.time())
    pipe = livestate.client().pipeline(transaction=False)
    expiry = int(shared_seconds() * 1000)
    pipe.set(TOTALS_KEY, _encoder.encode(totals), px=expiry)
    for figure, order in orders.items():
        pipe.set(keys.fleet_sort_figures(figure), _encoder.encode(order), px=expiry)
    pipe.execute()
    return totals, orders


def totals(now: float) -> FleetTotals:
    """The shared totals, or computed now and shared if missing (raises redis errors)."""
    raw = cast(bytes | None, livestate.client().get(TOTALS_KEY))
    if raw is not None:
        try:
            return _totals_decoder.decode(raw)
        except msgspec.DecodeError:
            pass  # Written by another version: computed again below.
    return refresh(now)[0]


def order_by(figure: str, now: float) -> list[str]:
    """The nodes with a fresh load, ascending by `figure` (ties by id): shared, or computed now and
    shared if missing (raises redis errors). A sort reads one list of ids, never a load."""
    raw = cast(bytes | None, livestate.client().get(keys.fleet_sort_figures(figure)))
    if raw is not None:
        try:
            return _order_decoder.decode(raw)
        except msgspec.DecodeError:
            pass
    return refresh(now)[1][figure]


def forget() -> None:
    """Drop the shared figures, so the next reader computes them (benchmarks, tests)."""
    livestate.client().delete(TOTALS_KEY, *(keys.fleet_sort_figures(figure) for figure in SORT_FIGURES))
