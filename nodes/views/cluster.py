"""The cluster page `/`: a fleet summary and the node table, sorted, filtered and paged on the server.

The URL carries sort, filters and page, so a view can be shared and each poll
asks for the same rows; nodes/filtersets.py reads them and lists the nodes.
The table is the partial `node-table`, rendered inline in the page and alone
for htmx; the summary rides along out of band.
"""

from __future__ import annotations

import time

from django.shortcuts import render
from django.views.decorators.http import require_GET

from inventory.models import Deployment, NodeState
from nodes import promalerts, promengines
from nodes.filtersets import TableQuery, sorted_nodes
from nodes.loads import fetch_readings
from nodes.views.access import login_required
from nodes.views.rows import node_rows
from nodes.views.summary import summary

PAGE_SIZE = 100

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


def header_cells(query: TableQuery) -> list[dict]:
    """The header cells: where each links to (the current column flips direction) and which is active."""
    cells = []
    for label, sort, numeric in COLUMNS:
        active = ""
        link = sort
        if sort is not None and sort == query.sort:
            active = "descending" if query.descending else "ascending"
            link = sort if query.descending else f"-{sort}"
        key = label.split()[0].lower()
        cells.append({"label": label, "key": key, "sort": link, "active": active, "numeric": numeric})
    return cells


def table_page(query: TableQuery, now: float) -> dict:
    """The rows of the asked-for page, what the pager needs, and any problem reading loads."""
    found = sorted_nodes(query, now)
    pages = found.pages(PAGE_SIZE)
    # A page past the end (the fleet shrank since the link was made) shows the last one.
    page = min(query.page, pages)
    page_nodes = found.page(page, PAGE_SIZE)
    readings, problem = fetch_readings([node.pk for node in page_nodes], now)
    rows = node_rows(page_nodes, readings, now, problem)
    return {"rows": rows, "count": found.count, "page": page, "pages": pages, "table_problem": problem}


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
        "columns": header_cells(query),
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
