"""The nodes list: the cluster table's filters and sort, with figures as numbers instead of text.

Filtering and sorting (`TableQuery`, `sorted_nodes`) are nodes/filtersets.py's,
shared with the cluster page, so the API and the page list the same nodes in
the same order. The rest
of a page costs the same few queries whatever the fleet's size: the page of
nodes, their count, and one query each for their GPUs, GPU claims, disks and
placed shards.
"""

from __future__ import annotations

from collections import defaultdict

from django.db.models import Count

from inventory.models import GPU, Allocation, Filesystem, GPUClaim, Node
from inventory.models.gpus import HEALTH_OK
from nodes.filtersets import TableQuery, sorted_nodes
from nodes.loads import Reading, fetch_readings, heartbeat_age


def table_query(params: dict) -> TableQuery:
    sort = params["sort"]
    return TableQuery(
        sort=sort.removeprefix("-"),
        descending=sort.startswith("-"),
        state=params["state"],
        label=params["label"].strip(),
        gpu=params["gpu"].strip(),
        q=params["q"].strip(),
        page=params["page"],
    )


def page_of_nodes(query: TableQuery, page_size: int, now: float) -> tuple[list[Node], int]:
    """One page of matching nodes in the table's order, and how many match in all."""
    found = sorted_nodes(query, now)
    return found.page(query.page, page_size), found.count


def load_fields(reading: Reading) -> dict:
    load = reading.load
    figures = None
    if load is not None:
        figures = {
            "age_seconds": reading.age,
            "cpu_percent": load.cpu_percent,
            "cpus": load.cpus,
            "load1": load.load1,
            "load5": load.load5,
            "load15": load.load15,
            "memory_used_bytes": load.memory_used_bytes,
            "memory_available_bytes": load.memory_available_bytes,
        }
    return {"load": figures, "load_age_seconds": reading.age}


def node_rows(nodes: list[Node], now: float) -> tuple[list[dict], str | None]:
    ids = [node.pk for node in nodes]
    readings, problem = fetch_readings(ids, now)
    gpus: dict[str, list[tuple[int, str, str]]] = defaultdict(list)
    # Each without the model's default order, which would join the node table for nothing.
    for node_id, index, health, klass in (
        GPU.objects.filter(node_id__in=ids).order_by().values_list("node_id", "index", "health", "gpu_class")
    ):
        gpus[node_id].append((index, health, klass))
    claimed: dict[str, set[int]] = defaultdict(set)
    for node_id, index in GPUClaim.objects.filter(node_id__in=ids).order_by().values_list("node_id", "gpu_index"):
        claimed[node_id].add(index)
    disks: dict[str, dict[str, int]] = {}
    for node_id, free, total in (
        Filesystem.objects.filter(node_id__in=ids, shared=False)
        .order_by()
        .values_list("node_id", "free_bytes", "total_bytes")
    ):
        disk = disks.setdefault(node_id, {"free_bytes": 0, "total_bytes": 0})
        disk["free_bytes"] += free
        disk["total_bytes"] += total
    engines = dict(
        Allocation.objects.filter(node_id__in=ids)
        .order_by()
        .values("node_id")
        .annotate(n=Count("id"))
        .values_list("node_id", "n")
    )
    rows = []
    for node in nodes:
        node_gpus = gpus.get(node.pk, [])
        taken = claimed.get(node.pk, set())
        rows.append(
            {
                "id": node.pk,
                "hostname": node.hostname,
                "state": node.state,
                "admin_state": node.admin_state,
                "liveness": node.liveness,
                "labels": node.all_labels,
                "gpus": {
                    "total": len(node_gpus),
                    "free": sum(1 for index, health, _ in node_gpus if health == HEALTH_OK and index not in taken),
                    "classes": sorted({klass for _, _, klass in node_gpus}),
                },
                "disk": disks.get(node.pk),
                "engines": engines.get(node.pk, 0),
                "heartbeat_age_seconds": heartbeat_age(node.last_heartbeat, readings[node.pk], now),
                **load_fields(readings[node.pk]),
            }
        )
    return rows, problem
