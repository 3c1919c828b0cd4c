"""The model page `/models/<served model>/`: what the gateway did for one served model, by replica.

Its replicas and their requests in flight at the gateways refresh every 5 s (`model-live`);
the charts (requests/s, errors, time to first token p50/p99 and p99 by replica, tokens/s, in flight) load after
the page and refresh every 30 s from their own URL, as the node page's do, over the range the
page's URL chose. Without Prometheus the page still lists the replicas and says why the
numbers are missing.
"""

from __future__ import annotations

from django.http import Http404
from django.shortcuts import render
from django.views.decorators.http import require_GET
from django_htmx.http import HttpResponseStopPolling

from inventory.models import REPLICA_COLOURS, Deployment, Replica, ReplicaState
from nodes import promgateway, promquery
from nodes.views.access import login_required
from nodes.views.node import charts_section, chosen_range


def _deployment(served_model: str) -> Deployment | None:
    return Deployment.objects.filter(served_model_name=served_model).first()


def replica_rows(deployment: Deployment) -> tuple[list[dict], str | None]:
    """Each replica with its state, nodes and requests in flight at the gateways; and why those may be missing."""
    in_flight = promgateway.in_flight_per_replica()
    replicas = Replica.objects.filter(deployment=deployment).prefetch_related("shards").order_by("ordinal")
    rows = [
        {
            "id": replica.replica_id,
            "state": ReplicaState(replica.state),
            "state_colour": REPLICA_COLOURS[ReplicaState(replica.state)],
            "nodes": sorted({shard.node_id for shard in replica.shards.all() if shard.node_id}),
            # None: Prometheus has no series for it (not routed to, or not scraped), shown as —.
            "in_flight": in_flight.values.get(replica.replica_id),
        }
        for replica in replicas
    ]
    return rows, in_flight.problem


@require_GET
@login_required
def model(request, served_model: str):
    deployment = _deployment(served_model)
    if deployment is None:
        if request.htmx:
            # The deployment was deleted or renamed while its page was open: stop polling for it.
            return HttpResponseStopPolling()
        raise Http404("no such served model")
    rows, in_flight_problem = replica_rows(deployment)
    context = {"deployment": deployment, "replicas": rows, "in_flight_problem": in_flight_problem}
    if request.htmx:
        return render(request, "nodes/model.html#live", context)
    context["time_range"], context["range_problem"] = chosen_range(request.GET)
    context["ranges"] = list(promquery.RANGES.values())
    return render(request, "nodes/model.html", context)


@require_GET
@login_required
def model_charts(request, served_model: str):
    if _deployment(served_model) is None:
        if request.htmx:
            return HttpResponseStopPolling()
        raise Http404("no such served model")
    return charts_section(
        request, "nodes/model.html#charts", {"served_model": served_model}, promgateway.model_charts(served_model)
    )
