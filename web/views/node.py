"""The node page `/nodes/<id>/`: what the node is, what it is doing now, and its last hour.

Live numbers (`node-live`) refresh every 5 s; the charts (`node-charts`) load
after the page and refresh every 30 s from their own URL, so a slow Prometheus
never holds the page up.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from django.http import Http404
from django.shortcuts import get_object_or_404, render
from django.views.decorators.http import require_GET
from django_htmx.http import HttpResponseStopPolling

from agent.protocol import GPULoad, Load
from inventory.models import (
    CONDITION_COLOURS,
    GPU,
    REPLICA_COLOURS,
    Allocation,
    GPUCondition,
    Node,
    ReplicaState,
    Shard,
)
from inventory.operator import ACTIONS
from web import promquery
from web.views.access import login_required
from web.views.loads import fetch_readings, heartbeat_age

EVENTS_SHOWN = 20


@dataclass
class EngineRow:
    """One shard on the node: what placement gave it, and what it uses now.

    A field per column, so a new column is one field here and one cell in the
    template.
    """

    shard: str
    replica: str = ""
    model: str = ""
    gpus: list[int] = field(default_factory=list)
    memory_claimed_gb: int | None = None
    cpu_cores: float | None = None
    rss_bytes: int | None = None
    # The shard's state as placement records it; None for a shard it does not know.
    state: ReplicaState | None = None
    # A shard the agent measures that no allocation on this node accounts for.
    unplaced: bool = False

    @property
    def state_colour(self) -> str:
        return REPLICA_COLOURS[self.state] if self.state else ""


def engine_rows(allocations: list[Allocation], load: Load | None, states: dict[str, str]) -> list[EngineRow]:
    """Allocations joined with the per-shard figures of the node's fresh load and the shards' states."""
    measured = {shard.shard: shard for shard in load.shards} if load else {}
    rows = []
    for allocation in allocations:
        shard = measured.pop(allocation.shard_id, None)
        rows.append(
            EngineRow(
                shard=allocation.shard_id,
                replica=allocation.replica_id,
                model=allocation.model,
                gpus=allocation.gpu_indices,
                memory_claimed_gb=allocation.memory_gb,
                cpu_cores=shard.cpu_cores if shard else None,
                rss_bytes=shard.rss_bytes if shard else None,
                state=ReplicaState(states[allocation.shard_id]) if allocation.shard_id in states else None,
            )
        )
    for name, shard in sorted(measured.items()):
        rows.append(EngineRow(shard=name, cpu_cores=shard.cpu_cores, rss_bytes=shard.rss_bytes, unplaced=True))
    return rows


@dataclass
class GPURow:
    """One GPU: what the database knows of it, who holds it, and its figures from the fresh load (None if none)."""

    gpu: GPU
    holder: str | None = None
    sample: GPULoad | None = None

    @property
    def condition(self) -> GPUCondition:
        return GPUCondition(self.gpu.condition)

    @property
    def condition_colour(self) -> str:
        return CONDITION_COLOURS[self.condition]


def gpu_rows(gpus: list[GPU], holders: dict[int, str], load: Load | None) -> list[GPURow]:
    """The node's GPUs with their holders and their samples; a sample of another card (uuid) is not theirs."""
    samples = {sample.index: sample for sample in load.gpus} if load else {}
    rows = []
    for gpu in gpus:
        sample = samples.get(gpu.index)
        if sample is not None and sample.uuid and gpu.uuid and sample.uuid != gpu.uuid:
            sample = None
        rows.append(GPURow(gpu, holders.get(gpu.index), sample))
    return rows


def valid_id(node_id: str) -> bool:
    """Whether the URL's id could name a node at all (PostgreSQL refuses NUL in a query)."""
    return "\x00" not in node_id


def _node(node_id: str) -> Node:
    if not valid_id(node_id):
        raise Http404("no such node")
    queryset = Node.objects.prefetch_related(
        "gpus",
        "filesystems",
        "fabrics",
        "weights",
        "engine_installs",
        "allocations__gpu_claims",
    )
    return get_object_or_404(queryset, pk=node_id)


def live_context(node: Node, now: float) -> dict:
    readings, load_problem = fetch_readings([node.pk], now)
    reading = readings[node.pk]
    allocations = list(node.allocations.all())
    holders = {claim.gpu_index: a.shard_id for a in allocations for claim in a.gpu_claims.all()}
    filesystems = list(node.filesystems.all())
    return {
        "node": node,
        "reading": reading,
        "load_problem": load_problem,
        "engines": engine_rows(
            allocations, reading.load, dict(Shard.objects.filter(node=node).values_list("shard_id", "state"))
        ),
        "gpus": gpu_rows(list(node.gpus.all()), holders, reading.load),
        "local_filesystems": [fs for fs in filesystems if not fs.shared],
        "shared_filesystems": [fs for fs in filesystems if fs.shared],
        "local_disk": node.local_disk(),
        "events": list(node.events.all()[:EVENTS_SHOWN]),
        "heartbeat_age": heartbeat_age(node.last_heartbeat, reading, now),
    }


@require_GET
@login_required
def node(request, node_id: str):
    now = time.time()
    try:
        found = _node(node_id)
    except Http404:
        if request.htmx:
            # The node was deleted while its page was open: stop polling for it.
            return HttpResponseStopPolling()
        raise
    context = live_context(found, now)
    if request.htmx:
        return render(request, "nodes/node.html#live", context)
    context["can_act"] = request.user.has_perm("inventory.change_node")
    context["actions"] = list(ACTIONS)
    return render(request, "nodes/node.html", context)


@require_GET
@login_required
def node_charts(request, node_id: str):
    if not valid_id(node_id) or not Node.objects.filter(pk=node_id).exists():
        if request.htmx:
            return HttpResponseStopPolling()
        raise Http404("no such node")
    context = {"node_id": node_id, "history": None, "history_problem": None}
    try:
        history = promquery.node_history(node_id)
    except promquery.PrometheusUnavailable as exc:
        context["history_problem"] = str(exc)
    else:
        context["history"] = history
        context["history_json"] = history.as_json()
    return render(request, "nodes/node.html#charts", context)
