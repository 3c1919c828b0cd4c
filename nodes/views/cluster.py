"""The cluster page `/`: a fleet summary and the node table, sorted, filtered and paged on the server.

The URL carries sort, filters and page, so a view can be shared and each poll
asks for the same rows. The table is the partial `node-table`, rendered inline
in the page and alone for htmx; the summary rides along out of band.
"""

from __future__ import annotations

import math
import time
from collections import Counter
from dataclasses import dataclass, field

from django.db.models import Case, Count, Exists, IntegerField, OuterRef, Q, QuerySet, Subquery, Value, When
from django.db.models.functions import Coalesce
from django.http import QueryDict
from django.shortcuts import render
from django.utils import timezone
from django.views.decorators.http import require_GET

from inventory.models import GPU, AdminState, GPUClaim, Liveness, Node, NodeState, derive_state
from inventory.models.gpus import HEALTH_OK
from inventory.queries import STATE_FILTERS, gpu_class_filter, label_filter
from nodes.views.access import login_required
from nodes.views.loads import Reading, fetch_readings

PAGE_SIZE = 100
MAX_TEXT = 200

# Worst first, so sorting by state puts the nodes that need a look at the top.
STATE_ORDER = Case(
    When(liveness=Liveness.LOST, then=Value(0)),
    When(liveness=Liveness.UNREACHABLE, then=Value(1)),
    When(admin_state=AdminState.DRAINING, then=Value(2)),
    When(admin_state=AdminState.CORDONED, then=Value(3)),
    default=Value(4),
    output_field=IntegerField(),
)


def _count(queryset: QuerySet) -> Coalesce:
    """A per-node count as a correlated subquery, so sorting by it needs no GROUP BY over the fleet."""
    counted = queryset.filter(node=OuterRef("pk")).order_by().values("node").annotate(n=Count("*")).values("n")
    return Coalesce(Subquery(counted, output_field=IntegerField()), 0)


def _free_gpus():
    healthy = _count(GPU.objects.filter(health=HEALTH_OK))
    return healthy - _count(GPUClaim.objects.all())


# Columns sorted by the database: each is a list of order_by terms, plus an
# annotation when the column is not a field.
DB_SORTS = {
    "id": ([], ["id"]),
    "hostname": ([], ["hostname", "id"]),
    "state": ([("state_order", lambda: STATE_ORDER)], ["state_order", "id"]),
    "gpus": ([("gpu_free", _free_gpus)], ["gpu_free", "id"]),
    "heartbeat": ([], ["last_heartbeat", "id"]),
}

# Columns sorted by the current load, read from Redis for every matching node.
# A node whose load is unknown or too old sorts after every known one.
LOAD_SORTS = {
    "cpu": lambda r: r.load.cpu_percent,
    "ram": lambda r: r.memory_percent or 0.0,
    "load": lambda r: r.load.load1,
}

# The table's columns in order: label, sort key (None: not sortable), numeric.
COLUMNS = (
    ("node", "id", False),
    ("hostname", "hostname", False),
    ("state", "state", False),
    ("CPU", "cpu", False),
    ("RAM", "ram", False),
    ("load 1m", "load", True),
    ("GPUs free", "gpus", True),
    ("disk free", None, True),
    ("engines", None, True),
    ("heartbeat", "heartbeat", True),
    ("labels", None, False),
)


@dataclass
class TableQuery:
    """What the URL asks of the table. Anything malformed falls back to the default."""

    sort: str = "id"
    descending: bool = False
    state: str = ""
    label: str = ""
    gpu: str = ""
    q: str = ""
    page: int = 1

    @classmethod
    def from_get(cls, get: QueryDict) -> TableQuery:
        query = cls()
        sort = get.get("sort", "")
        query.descending = sort.startswith("-")
        sort = sort.removeprefix("-")
        query.sort = sort if sort in DB_SORTS or sort in LOAD_SORTS else "id"
        query.state = get.get("state", "") if get.get("state", "") in STATE_FILTERS else ""
        query.label = get.get("label", "").strip()[:MAX_TEXT]
        query.gpu = get.get("gpu", "").strip()[:MAX_TEXT]
        query.q = get.get("q", "").strip()[:MAX_TEXT]
        try:
            query.page = max(int(get.get("page", "1")), 1)
        except ValueError:
            query.page = 1
        return query

    @property
    def filtered(self) -> bool:
        return bool(self.state or self.label or self.gpu or self.q)

    def nodes(self) -> QuerySet:
        queryset = Node.objects.all()
        if self.state:
            queryset = queryset.filter(STATE_FILTERS[self.state])
        if self.label:
            key, _, value = self.label.partition("=")
            if value or "=" in self.label:
                queryset = queryset.filter(label_filter(key.strip(), value.strip()))
            else:
                queryset = queryset.filter(Q(labels__has_key=key) | Q(operator_labels__has_key=key))
        if self.gpu:
            queryset = queryset.filter(gpu_class_filter(self.gpu))
        if self.q:
            queryset = queryset.filter(Q(id__icontains=self.q) | Q(hostname__icontains=self.q))
        return queryset

    def columns(self) -> list[dict]:
        """The header cells: where each links to (the current column flips direction) and which is active."""
        cells = []
        for label, sort, numeric in COLUMNS:
            active = ""
            link = sort
            if sort is not None and sort == self.sort:
                active = "descending" if self.descending else "ascending"
                link = sort if self.descending else f"-{sort}"
            cells.append({"label": label, "sort": link, "active": active, "numeric": numeric})
        return cells


@dataclass
class NodeRow:
    """One row of the table; every figure is computed from prefetched rows and the node's reading."""

    node: Node
    reading: Reading
    now: float

    @property
    def state(self) -> NodeState:
        return self.node.state

    @property
    def stands_out(self) -> bool:
        return self.state in (NodeState.UNREACHABLE, NodeState.LOST)

    @property
    def gpus_total(self) -> int:
        return len(self.node.gpus.all())

    @property
    def gpus_free(self) -> int:
        return len(self.node.free_gpus())

    @property
    def gpu_classes(self) -> str:
        return ", ".join(sorted(self.node.gpus_by_class()))

    @property
    def disk(self) -> tuple[int, int] | None:
        return self.node.local_disk()

    @property
    def engines(self) -> int:
        return len(self.node.allocations.all())

    @property
    def heartbeat_age(self) -> float | None:
        if self.node.last_heartbeat is None:
            return None
        return self.now - self.node.last_heartbeat.timestamp()

    @property
    def labels(self) -> list[str]:
        return [f"{key}={value}" for key, value in sorted(self.node.all_labels.items())]


@dataclass
class GPUClassCount:
    gpu_class: str
    free: int
    total: int


@dataclass
class Summary:
    """The fleet at a glance: nodes by state, cores busy, RAM used, GPUs free by class."""

    total: int = 0
    states: list[tuple[NodeState, int]] = field(default_factory=list)
    reporting: int = 0
    cores_busy: float = 0.0
    cores_total: int = 0
    memory_used: int = 0
    memory_total: int = 0
    gpus: list[GPUClassCount] = field(default_factory=list)

    @property
    def cpu_percent(self) -> float | None:
        return 100 * self.cores_busy / self.cores_total if self.cores_total else None

    @property
    def memory_percent(self) -> float | None:
        return 100 * self.memory_used / self.memory_total if self.memory_total else None


def fleet(now: float) -> tuple[Summary, dict[str, Reading], str | None]:
    """The summary and every node's reading, in two queries and one Redis round trip.

    The whole fleet's loads are needed for the CPU and RAM totals anyway, so
    the table reuses them for its rows and for sorting by load.
    """
    nodes = [
        (pk, derive_state(admin, liveness))
        for pk, admin, liveness in Node.objects.values_list("id", "admin_state", "liveness")
    ]
    readings, problem = fetch_readings((pk for pk, _ in nodes), now)
    counts = Counter(state for _, state in nodes)
    summary = Summary(total=len(nodes), states=[(state, counts.get(state, 0)) for state in NodeState])
    for reading in readings.values():
        load = reading.load
        if load is None:
            continue
        summary.reporting += 1
        summary.cores_busy += reading.cores_busy
        summary.cores_total += load.cpus
        summary.memory_used += load.memory_used_bytes
        summary.memory_total += reading.memory_total
    claimed = GPUClaim.objects.filter(node=OuterRef("node"), gpu_index=OuterRef("index"))
    by_class = (
        GPU.objects.order_by()
        .values("gpu_class")
        .annotate(total=Count("id"), free=Count("id", filter=Q(health=HEALTH_OK) & ~Q(Exists(claimed))))
        .order_by("gpu_class")
    )
    summary.gpus = [GPUClassCount(row["gpu_class"], row["free"], row["total"]) for row in by_class]
    return summary, readings, problem


def table_page(query: TableQuery, readings: dict[str, Reading], now: float) -> dict:
    """The rows of the asked-for page, and what the pager needs."""
    nodes = query.nodes()
    if query.sort in LOAD_SORTS:
        key = LOAD_SORTS[query.sort]
        ids = list(nodes.values_list("id", flat=True))
        known = [pk for pk in ids if readings[pk].load is not None]
        unknown = [pk for pk in ids if readings[pk].load is None]
        known.sort(key=lambda pk: (key(readings[pk]), pk), reverse=query.descending)
        ordered = known + unknown
        count = len(ordered)
        pages = max(math.ceil(count / PAGE_SIZE), 1)
        page = min(query.page, pages)
        page_ids = ordered[(page - 1) * PAGE_SIZE : page * PAGE_SIZE]
        by_id = {node.pk: node for node in _with_related(Node.objects.filter(pk__in=page_ids))}
        page_nodes = [by_id[pk] for pk in page_ids if pk in by_id]
    else:
        annotations, order = DB_SORTS[query.sort]
        for name, expression in annotations:
            nodes = nodes.annotate(**{name: expression()})
        if query.descending:
            order = [f"-{term}" for term in order]
        count = nodes.count()
        pages = max(math.ceil(count / PAGE_SIZE), 1)
        page = min(query.page, pages)
        page_nodes = list(_with_related(nodes.order_by(*order))[(page - 1) * PAGE_SIZE : page * PAGE_SIZE])
    rows = [NodeRow(node, readings.get(node.pk) or Reading(None, now), now) for node in page_nodes]
    return {"rows": rows, "count": count, "page": page, "pages": pages}


def _with_related(nodes: QuerySet) -> QuerySet:
    # Everything a row shows, in a fixed number of queries whatever the page holds.
    return nodes.prefetch_related("gpus", "gpu_claims", "filesystems", "allocations")


@require_GET
@login_required
def cluster(request):
    now = time.time()
    query = TableQuery.from_get(request.GET)
    summary, readings, load_problem = fleet(now)
    context = {
        "query": query,
        "summary": summary,
        "load_problem": load_problem,
        "columns": query.columns(),
        "states": list(NodeState),
        "gpu_classes": [row.gpu_class for row in summary.gpus],
        "generated_at": timezone.now(),
        **table_page(query, readings, now),
    }
    template = "nodes/cluster.html#refresh" if request.htmx else "nodes/cluster.html"
    return render(request, template, context)
