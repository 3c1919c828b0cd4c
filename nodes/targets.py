"""Prometheus HTTP service discovery of the engines: where each running shard serves its own /metrics.

Prometheus polls this (`http_sd_configs`) and scrapes the engines directly,
for figures only they know, such as queue depth. One query, whatever the
fleet size.

A node must not choose what Prometheus scrapes: a target's host is the node's
trusted address (inventory/endpoints.py `trusted_address`), never what its
agent claims; a node without one has no target. Its port is the engine's, on
that host.
"""

from __future__ import annotations

import logging

from django.db import DatabaseError
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views.decorators.http import require_GET

from inventory.endpoints import trusted_address
from inventory.models import ReplicaState, Shard

# The same optional bearer token as /metrics: both tell a reader where the fleet is.
from nodes.metrics.views import _authorized

log = logging.getLogger(__name__)


@require_GET
def prometheus_targets(request: HttpRequest) -> HttpResponse:
    if not _authorized(request):
        response = JsonResponse({"error": "a bearer token is required"}, status=401)
        response["WWW-Authenticate"] = 'Bearer realm="llmgw"'
        return response
    rows = (
        Shard.objects.filter(state=ReplicaState.RUNNING, node__isnull=False)
        .order_by("shard_id")
        .values_list(
            "shard_id",
            "port",
            "metrics_port",
            "node_id",
            "node__mgmt_addr",
            "node__source_addr",
            "replica__replica_id",
            "replica__deployment__model_source",
            "replica__deployment__engine",
            "replica__deployment__served_model_name",
        )
    )
    try:
        groups = _groups(rows)
    except DatabaseError as exc:
        log.warning("engine targets: database unavailable: %s", exc)
        return JsonResponse({"error": "database unavailable"}, status=503)
    return JsonResponse(groups, safe=False)


def _groups(rows) -> list[dict]:
    groups = []
    for shard, port, metrics_port, node, claimed, source, replica, model, engine, served in rows:
        host = trusted_address(claimed, source)
        if host is None:
            continue
        groups.append(
            {
                "targets": [f"{host}:{metrics_port or port}"],
                # served_model joins the engine's series to the gateway's (backend m_<served_model>).
                "labels": {
                    "node": node,
                    "shard": shard,
                    "replica": replica,
                    "model": model,
                    "engine": engine,
                    "served_model": served,
                },
            }
        )
    return groups
