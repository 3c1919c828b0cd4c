"""The inventory as /metrics needs it: at most seven queries, whatever the fleet size.

Sums and counts per node are left to the database (GROUP BY) rather than done
over one row per GPU here: at 10,000 nodes of 8 GPUs that is 10,000 rows
instead of 80,000 model instances. The querysets are built by the ORM, but
the bulky ones are read as the driver returns them: Django's per-row
converters cost as much as the queries themselves at that size, and these
columns (text and integers; PostgreSQL returns sums as Decimal) need none
but the last heartbeat, converted here.

On PostgreSQL only the nodes' rows are read every time (their last heartbeats
move at every sweep); each other part is read again when a table it reads has
changed, which one query of their marks tells (nodes.metrics.tablemarks).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import NamedTuple

from django.db import connections, models
from django.db.models import Count, OuterRef, Q, QuerySet, Subquery, Sum

from inventory.models import GPU, Allocation, Deployment, EngineInstall, Filesystem, GPUClaim, Node, Replica, free_q
from nodes.metrics import tablemarks


class NodeFacts(NamedTuple):
    """What /metrics exports of one node but its last heartbeat, so it changes rarely (the row cache's key).

    Agent fields (a subset of AGENT_FIELDS, pinned by a test) and the two that make the state.
    """

    id: str
    hostname: str
    memory_total_bytes: int | None
    os: str
    os_version: str
    kernel: str
    arch: str
    cpu_model: str
    agent_version: str
    admin_state: str
    liveness: str


class NodeRow(NamedTuple):
    facts: NodeFacts
    # Seconds since the epoch; None before the first heartbeat.
    last_heartbeat: float | None


class GPURow(NamedTuple):
    node: str
    gpu_class: str
    count: int  # type: ignore[assignment]  # a field named as tuple's method: a NamedTuple allows it
    free: int
    memory: int | None


class GPUConditionRow(NamedTuple):
    """One GPU and the control plane's verdict on it (inventory.gpuhealth)."""

    node: str
    index: int  # type: ignore[assignment]  # a field named as tuple's method: a NamedTuple allows it
    uuid: str
    condition: str


class DiskRow(NamedTuple):
    """A node's non-shared filesystems summed; only nodes with any filesystem have a row."""

    node: str
    free: int
    size: int


class AllocationRow(NamedTuple):
    node: str
    shard: str
    replica: str
    model: str
    memory_gb: int
    # The deployment's served model name (what clients send through the gateway); empty for a replica gone.
    served_model: str
    gpus: int


class InstallRow(NamedTuple):
    node: str
    engine: str
    version: str
    variant: str
    state: str


@dataclass
class Inventory:
    """Rows, not model instances: a scrape only formats them."""

    nodes: list[NodeRow]
    gpus: list[GPURow]
    gpu_conditions: list[GPUConditionRow]
    disks: list[DiskRow]
    allocations: list[AllocationRow]
    installs: list[InstallRow]


def read() -> Inventory:
    """The whole fleet's inventory: the nodes every time, the other tables when they changed (_kept)."""
    return _kept.read()


# Each part of the inventory but the nodes, with the tables its rows are read from: the nodes' rows
# change at every sweep's flush (their last heartbeat), the others only when a node registers anew, a
# GPU's condition, an install or a placement changes.
_PARTS: dict[str, tuple[type[models.Model], ...]] = {
    "gpus": (GPU, GPUClaim),
    "gpu_conditions": (GPU,),
    "disks": (Filesystem,),
    "allocations": (Allocation, GPUClaim, Replica, Deployment),
    "installs": (EngineInstall,),
}
_MARKED_TABLES = sorted({model._meta.db_table for models_read in _PARTS.values() for model in models_read})


class _Kept:
    """Each part's rows, kept while the marks of the tables it reads are unchanged (nodes.metrics.tablemarks).

    The same list is given again, so the row caches behind it answer at once (nodes.metrics.rowcache).
    """

    def __init__(self) -> None:
        self.parts: dict[str, tuple[tuple[str, ...], list]] = {}

    def read(self) -> Inventory:
        # First: a change committed after the marks is in the rows read below, and read again next time.
        marks = tablemarks.read(_MARKED_TABLES, using=GPU.objects.db)
        node_rows = raw_rows(Node.objects.order_by().values_list(*NodeFacts._fields, "last_heartbeat"))
        return Inventory(
            nodes=[NodeRow(NodeFacts._make(row[:-1]), heartbeat_seconds(row[-1])) for row in node_rows],
            gpus=self.part("gpus", marks, _gpus),
            gpu_conditions=self.part("gpu_conditions", marks, _gpu_conditions),
            disks=self.part("disks", marks, _disks),
            allocations=self.part("allocations", marks, _allocations),
            installs=self.part("installs", marks, _installs),
        )

    def part(self, name: str, marks: dict[str, str] | None, rows: Callable[[], list]) -> list:
        if marks is None:
            return rows()
        mark = tuple(marks[model._meta.db_table] for model in _PARTS[name])
        kept = self.parts.get(name)
        if kept is not None and kept[0] == mark:
            return kept[1]
        fresh = rows()
        self.parts[name] = (mark, fresh)
        return fresh


_kept = _Kept()


def forget() -> None:
    """Keep nothing: the next read reads every table."""
    _kept.parts = {}


def _gpus() -> list[GPURow]:
    return [
        GPURow._make(row)
        for row in raw_rows(
            GPU.objects.order_by()
            .values_list("node_id", "gpu_class")
            .annotate(count=Count("id"), free=Count("id", filter=free_q()), memory=Sum("memory_bytes"))
        )
    ]


def _gpu_conditions() -> list[GPUConditionRow]:
    return [
        GPUConditionRow._make(row)
        for row in raw_rows(
            GPU.objects.order_by("node_id", "index").values_list("node_id", "index", "uuid", "condition")
        )
    ]


def _disks() -> list[DiskRow]:
    local = Q(shared=False)
    return [
        DiskRow._make(row)
        for row in raw_rows(
            Filesystem.objects.order_by()
            .values_list("node_id")
            .annotate(free=Sum("free_bytes", filter=local, default=0), size=Sum("total_bytes", filter=local, default=0))
        )
    ]


def _allocations() -> list[AllocationRow]:
    # GPUs per allocation counted apart and joined here: on PostgreSQL this is
    # half the time of a join or a correlated count over 40,000 allocations.
    claims = dict(raw_rows(GPUClaim.objects.order_by().values_list("allocation_id").annotate(count=Count("*"))))
    # The served model name read through the replica in the same query, so a rename shows at the next scrape.
    served_model = Replica.objects.filter(replica_id=OuterRef("replica_id")).values("deployment__served_model_name")
    return [
        AllocationRow(node, shard, replica, model, memory_gb, served or "", claims.get(pk, 0))
        for pk, node, shard, replica, model, memory_gb, served in raw_rows(
            Allocation.objects.order_by()
            .annotate(served_model=Subquery(served_model[:1]))
            .values_list("pk", "node_id", "shard_id", "replica_id", "model", "memory_gb", "served_model")
        )
    ]


def _installs() -> list[InstallRow]:
    return [
        InstallRow._make(row)
        for row in raw_rows(
            EngineInstall.objects.order_by("node_id", "engine", "version", "variant").values_list(
                "node_id", "engine", "version", "variant", "state"
            )
        )
    ]


def heartbeat_seconds(value: datetime | str | None) -> float | None:
    """A DateTimeField as the driver returns it: PostgreSQL a datetime, SQLite UTC as ISO text."""
    if value is None:
        return None
    if isinstance(value, str):
        value = datetime.fromisoformat(value)
    if value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    return value.timestamp()


def raw_rows(queryset: QuerySet) -> list[tuple]:
    """The rows of a values_list queryset as the database driver returns them, in its column order."""
    sql, params = queryset.query.sql_with_params()
    with connections[queryset.db].cursor() as cursor:
        cursor.execute(sql, params)
        return cursor.fetchall()
