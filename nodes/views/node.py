"""The node page `/nodes/<id>/`: what the node is, what fires for it, what it is doing now, and its history.

Live numbers and firing alerts (`node-live`) refresh every 5 s; the charts
(`node-charts`) load after the page and refresh every 30 s from their own URL,
over the range the page's URL chose (`?range=6h`), so a slow Prometheus never
holds the page up. The node's events in that range are drawn on every chart
and listed below them: the page's one list of them.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime

from django.http import Http404, HttpResponse, HttpResponseBadRequest
from django.shortcuts import get_object_or_404, render
from django.views.decorators.http import require_GET
from django_htmx.http import HttpResponseStopPolling

from agent.protocol import GPULoad, Load
from inventory import endpoints, engine_wants
from inventory.models import (
    CONDITION_COLOURS,
    GPU,
    REPLICA_COLOURS,
    Allocation,
    EngineInstall,
    GPUCondition,
    Node,
    NodeEvent,
    ReplicaState,
    Shard,
)
from inventory.operator import ACTIONS
from nodes import promalerts, promengines, promgateway, promquery
from nodes.loads import fetch_readings, heartbeat_age
from nodes.views.access import login_required

# Markers a chart draws at most: the newest ones in the range. A week of a flapping
# node could hold thousands, and past a few hundred lines a chart is only ink.
MARKERS_SHOWN = 200


# A shard's resident memory this far above its profile's claim is flagged (the
# LLMGWShardOverMemoryClaim alert uses the same ratio, sustained for 10 minutes).
OVER_CLAIM_RATIO = 1.2


@dataclass(frozen=True)
class ShardFacts:
    """What the node page reads of one of the node's shards, in its one shard query."""

    state: str
    reason: str
    port: int
    replica: str
    model: str
    engine: str
    variant: str
    served_model: str


@dataclass
class EngineRow:
    """One shard on the node: what placement gave it, and what it uses now.

    A field per column, so a new column is one field here and one cell in the
    template.
    """

    shard: str
    replica: str = ""
    model: str = ""
    # What clients send as `model` through the gateway.
    served_model: str = ""
    gpus: list[int] = field(default_factory=list)
    memory_claimed_gb: int | None = None
    cpu_cores: float | None = None
    rss_bytes: int | None = None
    # The shard's state as placement records it; None for a shard it does not know.
    state: ReplicaState | None = None
    # Why it is in that state: the agent's last report (an exit code and the engine's last lines),
    # or the install it waits for.
    reason: str = ""
    # Where clients reach the engine (its OpenAI-compatible API); empty for a shard not placed here.
    endpoint: str = ""
    # A shard the agent measures that no allocation on this node accounts for.
    unplaced: bool = False
    # Why a running shard has no engine metrics in Prometheus (nodes/promengines.py); empty when it has.
    no_engine_metrics: str = ""
    # Requests in flight on the shard's replica at the gateways (nodes/promgateway.py); None when unknown.
    in_flight: float | None = None

    @property
    def state_colour(self) -> str:
        return REPLICA_COLOURS[self.state] if self.state else ""

    @property
    def over_claim(self) -> bool:
        """Resident memory more than 20 % over the claim; an undeclared claim is never exceeded."""
        if not self.memory_claimed_gb or self.rss_bytes is None:
            return False
        return self.rss_bytes > OVER_CLAIM_RATIO * self.memory_claimed_gb * 2**30


def engine_rows(
    allocations: list[Allocation],
    load: Load | None,
    shards: dict[str, ShardFacts],
    installs: Sequence[EngineInstall] = (),
    address: str = "",
) -> list[EngineRow]:
    """Allocations joined with the per-shard figures of the node's fresh load and the shards' facts,
    then the node's failed shards (kept an hour with why), then what runs unaccounted for."""
    measured = {shard.shard: shard for shard in load.shards} if load else {}
    waiting = _install_waits(installs)
    rows = []
    for allocation in allocations:
        shard = measured.pop(allocation.shard_id, None)
        facts = shards.get(allocation.shard_id)
        rows.append(
            EngineRow(
                shard=allocation.shard_id,
                replica=allocation.replica_id,
                model=allocation.model,
                served_model=facts.served_model if facts else "",
                gpus=allocation.gpu_indices,
                memory_claimed_gb=allocation.memory_gb,
                cpu_cores=shard.cpu_cores if shard else None,
                rss_bytes=shard.rss_bytes if shard else None,
                state=ReplicaState(facts.state) if facts else None,
                reason=_reason(facts, waiting) if facts else "",
                endpoint=endpoints.endpoint(address, facts.port) if facts and address else "",
            )
        )
    for name, facts in sorted(shards.items()):
        if facts.state == ReplicaState.FAILED:
            rows.append(
                EngineRow(
                    shard=name,
                    replica=facts.replica,
                    model=facts.model,
                    served_model=facts.served_model,
                    state=ReplicaState.FAILED,
                    reason=facts.reason,
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


def _install_waits(installs: Iterable[EngineInstall]) -> dict[tuple[str, str], str]:
    """What a placed shard waits for, by (engine, variant): an install under way, with its step."""
    return {
        (i.engine, i.variant): " ".join(filter(None, ["waiting for", i.engine, i.version])) + f": {i.detail or i.state}"
        for i in installs
        if i.state == EngineInstall.State.INSTALLING
    }


def _reason(facts: ShardFacts, waiting: dict[tuple[str, str], str]) -> str:
    if facts.state == ReplicaState.PLACED:
        return waiting.get((facts.engine, facts.variant), facts.reason)
    return facts.reason


def shard_facts(node: Node) -> dict[str, ShardFacts]:
    rows = Shard.objects.filter(node=node).values_list(
        "shard_id",
        "state",
        "reason",
        "port",
        "replica__replica_id",
        "replica__deployment__model_source",
        "replica__deployment__engine",
        "replica__deployment__gpus_per_shard",
        "replica__deployment__served_model_name",
    )
    return {
        shard_id: ShardFacts(state, reason, port, replica, model, engine, engine_wants.variant(gpus), served)
        for shard_id, state, reason, port, replica, model, engine, gpus, served in rows
    }


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


def event_text(event: NodeEvent) -> str:
    """One line that says what happened, by whom and why, for a marker and the list under the charts."""
    text = f"{event.get_kind_display()}: {event.from_state or '—'} → {event.to_state or '—'}"
    if event.reason:
        text += f" · “{event.reason}”"
    if event.actor:
        text += f" — {event.actor}"
    if event.repeats > 1:
        # Repeats folded into this event (inventory/events.py); the reason is the first's.
        text += f" · {event.repeats} times, last at {event.last_at:%Y-%m-%d %H:%M:%S} UTC"
    return text


def events_in(node_id: str, start: float, end: float) -> list[dict]:
    """The node's `NodeEvent`s from `start` to `end` (epoch seconds), oldest first, at most MARKERS_SHOWN.

    Admin and liveness changes, registrations, GPUs, replicas placed, rebuilt,
    released and failed, engines failed and restarted, and installs: each is
    recorded where it happens, so no shard's latest change needs to be read here.
    """
    since, until = datetime.fromtimestamp(start, UTC), datetime.fromtimestamp(end, UTC)
    node_events = NodeEvent.objects.filter(node_id=node_id, at__gte=since, at__lte=until)[:MARKERS_SHOWN]
    events = [
        {"id": f"e{e.pk}", "t": e.at.timestamp(), "at": e.at, "kind": e.kind, "text": event_text(e)}
        for e in node_events
    ]
    events.sort(key=lambda event: event["t"])
    return events


def chosen_range(get) -> tuple[promquery.TimeRange, str | None]:
    """The range the URL asks for; an unknown one falls back to the default, with a sentence saying so.

    A shared link with a typo still shows the node, as the cluster page's malformed
    parameters fall back instead of failing.
    """
    key = get.get("range", promquery.DEFAULT_RANGE.key)
    if key in promquery.RANGES:
        return promquery.RANGES[key], None
    known = ", ".join(promquery.RANGES)
    fallback = promquery.DEFAULT_RANGE.label
    return promquery.DEFAULT_RANGE, f"range: {key[:20]!r} is not one of {known}; showing {fallback}"


def charts_section(request, template: str, context: dict, charts) -> HttpResponse:
    """A page's charts partial, drawn from `charts` (promgateway's queries) over the range the URL asks for.

    Only the page builds this URL, from a range it knows: anything else is refused, by name. Prometheus
    down is said in the section, and the rest of the page is unaffected.
    """
    key = request.GET.get("range", promquery.DEFAULT_RANGE.key)
    if key not in promquery.RANGES:
        return HttpResponseBadRequest(f"range: must be one of {', '.join(promquery.RANGES)}")
    time_range = promquery.RANGES[key]
    context = {**context, "time_range": time_range, "history": None, "history_problem": None}
    try:
        history = promquery.history(charts, time_range=time_range)
    except promquery.PrometheusUnavailable as exc:
        context["history_problem"] = str(exc)
    else:
        context["history"] = history
        context["history_json"] = history.as_json()
    return render(request, template, context)


def mark_engine_metrics(node_id: str, rows: list[EngineRow], facts: dict[str, ShardFacts], now: float) -> None:
    """Say on each running shard's row why it has no engine metrics, if it has none.

    Only a running shard's engine is expected to export them: a starting one may not
    answer yet, and a failed one has no engine.
    """
    running = [
        (row.shard, facts[row.shard].engine) for row in rows if row.state == ReplicaState.RUNNING and row.shard in facts
    ]
    reasons = promengines.node_reasons(node_id, running, now)
    for row in rows:
        row.no_engine_metrics = reasons.get(row.shard, "")


def live_context(node: Node, now: float) -> dict:
    readings, load_problem = fetch_readings([node.pk], now)
    reading = readings[node.pk]
    allocations = list(node.allocations.all())
    holders = {claim.gpu_index: a.shard_id for a in allocations for claim in a.gpu_claims.all()}
    filesystems = list(node.filesystems.all())
    firing = promalerts.firing()
    installs = list(node.engine_installs.all())
    facts = shard_facts(node)
    engines = engine_rows(
        allocations,
        reading.load,
        facts,
        installs,
        node.address or "",
    )
    mark_engine_metrics(node.pk, engines, facts, now)
    # Only a running replica can have requests in flight: without one, Prometheus is not asked.
    serving = any(row.replica and row.state == ReplicaState.RUNNING for row in engines)
    in_flight = promgateway.in_flight_per_replica() if serving else None
    for row in engines:
        row.in_flight = in_flight.values.get(row.replica) if in_flight and row.replica else None
    return {
        "node": node,
        "alerts": firing.for_node(node.pk),
        "alerts_problem": firing.problem,
        "reading": reading,
        "load_problem": load_problem,
        "engines": engines,
        "in_flight_problem": in_flight.problem if in_flight else None,
        "installs": installs,
        "gpus": gpu_rows(list(node.gpus.all()), holders, reading.load),
        "local_filesystems": [fs for fs in filesystems if not fs.shared],
        "shared_filesystems": [fs for fs in filesystems if fs.shared],
        "local_disk": node.local_disk(),
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
    context["time_range"], context["range_problem"] = chosen_range(request.GET)
    context["ranges"] = list(promquery.RANGES.values())
    return render(request, "nodes/node.html", context)


@require_GET
@login_required
def node_charts(request, node_id: str):
    if not valid_id(node_id) or not Node.objects.filter(pk=node_id).exists():
        if request.htmx:
            return HttpResponseStopPolling()
        raise Http404("no such node")
    # Only the page builds this URL, from a range it knows: anything else is refused, by name.
    key = request.GET.get("range", promquery.DEFAULT_RANGE.key)
    if key not in promquery.RANGES:
        return HttpResponseBadRequest(f"range: must be one of {', '.join(promquery.RANGES)}")
    time_range = promquery.RANGES[key]
    now = time.time()
    events = events_in(node_id, now - time_range.span, now)
    context = {
        "node_id": node_id,
        "time_range": time_range,
        "events": events,
        "history": None,
        "history_problem": None,
    }
    try:
        history = promquery.node_history(node_id, now=now, time_range=time_range)
    except promquery.PrometheusUnavailable as exc:
        context["history_problem"] = str(exc)
    else:
        context["history"] = history
        context["history_json"] = {
            **history.as_json(),
            "events": [{"id": e["id"], "t": e["t"], "kind": e["kind"], "text": e["text"]} for e in events],
        }
    return render(request, "nodes/node.html#charts", context)
