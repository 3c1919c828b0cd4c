"""The node table's filter, sort and page, for the cluster page and the operators' API alike.

As NetBox keeps `filtersets` apart from views: the page (nodes/views/cluster.py)
and the API (opsapi/nodelist.py) both list nodes through `sorted_nodes`, so they
show the same nodes in the same order, and neither imports the other.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import redis
from django.db.models import Q, QuerySet
from django.http import QueryDict

from inventory.models import GPU, Node, NodeState, state_order
from inventory.queries import count_per_node, gpu_class_filter, label_filter
from nodes import fleetload

# The node fields a listed row shows (page and API); nothing else is read from the node table.
ROW_FIELDS = ("id", "hostname", "labels", "operator_labels", "admin_state", "liveness", "last_heartbeat")

# The longest filter text taken: the page cuts a longer one, the API refuses it.
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

# Columns sorted by the current load, in the order the last shared computation found
# (nodes/fleetload.py). A node whose load is unknown or too old sorts after every known one.
LOAD_SORTS = tuple(fleetload.SORT_FIGURES)

SORTS = sorted(DB_SORTS) + sorted(LOAD_SORTS)


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


@dataclass(frozen=True)
class SortedNodes:
    """The nodes a table query matches, in its order: how many, and a function reading those from `start` to `end`."""

    count: int
    between: Callable[[int, int], list[Node]]

    def pages(self, size: int) -> int:
        """How many pages of `size` there are; one when nothing matches."""
        return max(math.ceil(self.count / size), 1)

    def page(self, number: int, size: int) -> list[Node]:
        """Page `number` (from 1) of `size` nodes; empty past the end."""
        return self.between((number - 1) * size, number * size)


def sorted_nodes(query: TableQuery, now: float) -> SortedNodes:
    """The matching nodes in the table's order; the page and the operators' API both list them through this."""
    nodes = query.nodes()
    if query.sort in LOAD_SORTS:
        # The fleet's nodes already in the figure's order, read once by whoever computed them
        # last: sorting is keeping the matching ones, with no load read again by each request.
        ids = list(nodes.values_list("id", flat=True))
        try:
            order = fleetload.order_by(query.sort, now)
        except redis.RedisError:
            order = []
        matching = set(ids)
        known = [pk for pk in order if pk in matching]
        if query.descending:
            known.reverse()
        in_order = set(known)
        ordered = known + [pk for pk in ids if pk not in in_order]

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
