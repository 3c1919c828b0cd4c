"""The cluster page `/`: a fleet summary and the node table, sorted, filtered and paged on the server.

The URL carries sort, filters and page, so a view can be shared and each poll
asks for the same rows. The table is the partial `node-table`, rendered inline
in the page and alone for htmx; the summary rides along out of band.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

import redis
from django.db.models import Q, QuerySet
from django.http import QueryDict
from django.shortcuts import render
from django.views.decorators.http import require_GET

from inventory.models import GPU, Deployment, Node, NodeState, state_order
from inventory.queries import count_per_node, gpu_class_filter, label_filter
from nodes import promalerts, promengines
from nodes.views.access import login_required
from nodes.views.loads import fetch_readings, fresh_figures
from nodes.views.rows import ROW_FIELDS, node_rows
from nodes.views.summary import summary

PAGE_SIZE = 100
MAX_TEXT = 200

# Columns sorted by the database: each is a list of order_by terms, plus an
# annotation when the column is not a field.
DB_SORTS = {
    "id": ([], ["id"]),
    "hostname": ([], ["hostname", "id"]),
    # Worst first, so sorting by state puts the nodes that need a look at the top.
    "state": ([("state_order", state_order)], ["state_order", "id"]),
    "gpus": ([("gpu_free", lambda: count_per_node(GPU.objects.free()))], ["gpu_free", "id"]),
    # The column shows the age, so ascending is the most recent heartbeat first.
    "heartbeat": ([], ["-last_heartbeat", "id"]),
}

# Columns sorted by the current load, read from Redis for every matching node.
# A node whose load is unknown or too old sorts after every known one.
LOAD_SORTS = {
    "cpu": lambda f: f.cpu_percent,
    "ram": lambda f: f.memory_fraction,
    "load": lambda f: f.load1,
}

# The table's columns in order: label, sort key (None: not sortable), numeric.
COLUMNS = (
    ("node", "id", False),
    ("hostname", "hostname", False),
    ("state", "state", False),
    ("alerts", None, True),
    ("CPU", "cpu", False),
    ("RAM", "ram", False),
    ("load 1m", "load", True),
    ("GPUs free", "gpus", True),
    ("disk free", None, True),
    ("engines", None, True),
    ("waiting", None, True),
    ("heartbeat", "heartbeat", True),
    ("labels", None, False),
)


def _text(get: QueryDict, name: str) -> str:
    # PostgreSQL refuses NUL in text, and nothing we store contains one.
    return get.get(name, "").replace("\x00", "").strip()[:MAX_TEXT]


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
        query.state = get.get("state", "") if get.get("state", "") in NodeState.values else ""
        query.label = _text(get, "label")
        query.gpu = _text(get, "gpu")
        query.q = _text(get, "q")
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
            queryset = queryset.in_state(self.state)
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
            key = label.split()[0].lower()
            cells.append({"label": label, "key": key, "sort": link, "active": active, "numeric": numeric})
        return cells


class SortedNodes(NamedTuple):
    """The nodes a table query matches, in its order: how many, and a function reading those from `start` to `end`."""

    count: int
    between: Callable[[int, int], list[Node]]


def sorted_nodes(query: TableQuery, now: float) -> SortedNodes:
    """The matching nodes in the table's order; the page and the operators' API both list them through this."""
    nodes = query.nodes()
    if query.sort in LOAD_SORTS:
        # Sorting by load needs the load of every matching node: one MGET for all of them.
        key = LOAD_SORTS[query.sort]
        ids = list(nodes.values_list("id", flat=True))
        try:
            figures = fresh_figures(ids, now)
        except redis.RedisError:
            figures = {}
        known = [pk for pk in ids if pk in figures]
        unknown = [pk for pk in ids if pk not in figures]
        known.sort(key=lambda pk: (key(figures[pk]), pk), reverse=query.descending)
        ordered = known + unknown

        def between(start: int, end: int) -> list[Node]:
            page_ids = ordered[start:end]
            by_id = {node.pk: node for node in Node.objects.filter(pk__in=page_ids).only(*ROW_FIELDS)}
            return [by_id[pk] for pk in page_ids if pk in by_id]

        return SortedNodes(len(ordered), between)
    annotations, order = DB_SORTS[query.sort]
    for name, expression in annotations:
        nodes = nodes.annotate(**{name: expression()})
    if query.descending:
        order = [term[1:] if term.startswith("-") else f"-{term}" for term in order]
    nodes = nodes.only(*ROW_FIELDS).order_by(*order)
    return SortedNodes(nodes.count(), lambda start, end: list(nodes[start:end]))


def table_page(query: TableQuery, now: float) -> dict:
    """The rows of the asked-for page, what the pager needs, and any problem reading loads."""
    count, between = sorted_nodes(query, now)
    pages = max(math.ceil(count / PAGE_SIZE), 1)
    # A page past the end (the fleet shrank since the link was made) shows the last one.
    page = min(query.page, pages)
    page_nodes = between((page - 1) * PAGE_SIZE, page * PAGE_SIZE)
    readings, problem = fetch_readings([node.pk for node in page_nodes], now)
    rows = node_rows(page_nodes, readings, now, problem)
    return {"rows": rows, "count": count, "page": page, "pages": pages, "table_problem": problem}


def waiting_cell(waiting: promengines.Answer, node_id: str) -> str:
    """A node's requests waiting: "?" when Prometheus cannot say, blank when the node has no engine metrics."""
    if waiting.problem:
        return "?"
    value = waiting.values.get(node_id)
    return "" if value is None else f"{value:.0f}"


@require_GET
@login_required
def cluster(request):
    now = time.time()
    query = TableQuery.from_get(request.GET)
    fleet = summary(now)
    table = table_page(query, now)
    # One call to Prometheus for the summary and every row, shared for a few seconds.
    firing = promalerts.firing()
    per_node = firing.per_node()
    for row in table["rows"]:
        row.alerts = per_node.get(row.id, 0)
    # One fleet-wide query for the requests waiting column, shared for a few seconds like the alerts.
    waiting = promengines.waiting_per_node()
    for row in table["rows"]:
        row.waiting = waiting_cell(waiting, row.id)
    context = {
        "query": query,
        "summary": fleet,
        "firing": firing,
        "waiting_problem": waiting.problem,
        "load_problem": table["table_problem"] or fleet.problem,
        "columns": query.columns(),
        "states": list(NodeState),
        "gpu_classes": [row.gpu_class for row in fleet.totals.gpus],
        **table,
    }
    if not request.htmx:
        # Links to each served model's page (nodes/views/models.py); not refreshed with the table.
        context["served_models"] = list(
            Deployment.objects.order_by("served_model_name").values_list("served_model_name", flat=True)
        )
    template = "nodes/cluster.html#refresh" if request.htmx else "nodes/cluster.html"
    return render(request, template, context)
