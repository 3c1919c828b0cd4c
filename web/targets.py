"""Prometheus HTTP service discovery of the engines: where each running shard serves its own /metrics.

Prometheus polls this (`http_sd_configs`) and scrapes the engines directly,
for figures only they know, such as queue depth. One query, whatever the
fleet size.
"""

from __future__ import annotations

import logging

from django.db import DatabaseError
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views.decorators.http import require_GET

from inventory.models import ReplicaState, Shard

# The same optional bearer token as /metrics: both tell a reader where the fleet is.
from web.metrics.views import _authorized

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
            "node__hostname",
            "replica__replica_id",
            "replica__deployment__model_source",
            "replica__deployment__engine",
        )
    )
    try:
        groups = _groups(rows)
    except DatabaseError as exc:
        log.warning("engine targets: database unavailable: %s", exc)
        return JsonResponse({"error": "database unavailable"}, status=503)
    return JsonResponse(groups, safe=False)


def _groups(rows) -> list[dict]:
    return [
        {
            "targets": [f"{addr or hostname or node}:{metrics_port or port}"],
            "labels": {"node": node, "shard": shard, "replica": replica, "model": model, "engine": engine},
        }
        for shard, port, metrics_port, node, addr, hostname, replica, model, engine in rows
    ]
