"""The cluster table's rows, built in Python with every figure already formatted.

The table is polled every 5 s by every open page, so its rows are built from
plain tuples (four queries for the whole page, whatever it holds) and hand
the template finished strings: rendering 100 rows then costs a few lookups
each instead of a property chain and a number filter per cell.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

from django.db.models import Count, QuerySet

from inventory.models import GPU, Allocation, Filesystem, Node, NodeState
from nodes.loads import Reading, heartbeat_age
from nodes.templatetags.llmgw import age, bar_class, gib


@dataclass
class Gauge:
    """A bar cell: the percent (for sorting in the browser), the bar's fill class, and the figure shown beside it."""

    percent: str = ""
    fill: str = "p0"
    text: str = ""

    @classmethod
    def of(cls, percent: float | None, text: str) -> Gauge:
        return cls(percent=f"{percent:.1f}" if percent is not None else "", fill=bar_class(percent), text=text)


@dataclass
class NodeRow:
    id: str
    url: str
    hostname: str
    state: NodeState
    stands_out: bool
    # Load: the figures when fresh, else `unknown` says why there are none.
    unknown: str = ""
    stale: bool = False
    cpu: Gauge = field(default_factory=Gauge)
    ram: Gauge = field(default_factory=Gauge)
    ram_available: str = ""
    load1: str = ""
    gpus: str = ""
    gpu_classes: str = ""
    disk_free: str = ""
    disk_total: str = ""
    engines: int = 0
    # Alerts firing for the node, from Prometheus (nodes/promalerts.py); set by the cluster view.
    alerts: int = 0
    # Requests waiting on the node's engines, from Prometheus (nodes/promengines.py); set by the cluster view:
    # "?" when Prometheus cannot say, "" when the node has no engine metrics.
    waiting: str = ""
    heartbeat: str = ""
    labels: list[str] = field(default_factory=list)


def node_rows(nodes: list[Node], readings: dict[str, Reading], now: float, load_problem: str | None) -> list[NodeRow]:
    ids = [node.pk for node in nodes]
    classes: dict[str, list[str]] = defaultdict(list)
    for node_id, klass in GPU.objects.filter(node_id__in=ids).values_list("node_id", "gpu_class"):
        classes[node_id].append(klass)
    free_gpus = _count_by_node(GPU.objects.free().filter(node_id__in=ids))
    disks: dict[str, list[int]] = {}
    for node_id, free, total in Filesystem.objects.filter(node_id__in=ids, shared=False).values_list(
        "node_id", "free_bytes", "total_bytes"
    ):
        disk = disks.setdefault(node_id, [0, 0])
        disk[0] += free
        disk[1] += total
    engines = _count_by_node(Allocation.objects.filter(node_id__in=ids))
    rows = []
    for node in nodes:
        state = node.state
        row = NodeRow(
            id=node.pk,
            url=node.get_absolute_url(),
            hostname=node.hostname,
            state=state,
            stands_out=state in (NodeState.UNREACHABLE, NodeState.LOST),
            engines=engines.get(node.pk, 0),
            heartbeat=age(heartbeat_age(node.last_heartbeat, readings[node.pk], now)),
            labels=[f"{key}={value}" for key, value in sorted(node.all_labels.items())],
        )
        _fill_load(row, readings[node.pk], load_problem)
        node_classes = classes.get(node.pk)
        if node_classes:
            row.gpus = f"{free_gpus.get(node.pk, 0)}/{len(node_classes)}"
            row.gpu_classes = ", ".join(sorted(set(node_classes)))
        if node.pk in disks:
            row.disk_free, row.disk_total = gib(disks[node.pk][0]), gib(disks[node.pk][1])
        rows.append(row)
    return rows


def _count_by_node(queryset: QuerySet) -> dict[str, int]:
    return dict(queryset.order_by().values("node_id").annotate(n=Count("id")).values_list("node_id", "n"))


def _fill_load(row: NodeRow, reading: Reading, load_problem: str | None) -> None:
    load = reading.load
    if load is None:
        if load_problem:
            row.unknown = "load unknown: Redis is not reachable"
        elif reading.stale:
            row.unknown = f"last load {age(reading.age)} old: too old to show"
            row.stale = True
        else:
            row.unknown = "no load reported"
        return
    row.cpu = Gauge.of(load.cpu_percent, f"{load.cpu_percent:.0f}% · {reading.cores_busy:.1f}/{load.cpus}")
    row.ram = Gauge.of(reading.memory_percent, f"{gib(load.memory_used_bytes)} / {gib(reading.memory_total)}")
    row.ram_available = gib(load.memory_available_bytes)
    row.load1 = f"{load.load1:.2f}"
