"""Prometheus HTTP service discovery of the engines: where each running shard serves its own /metrics.

Prometheus polls this (`http_sd_configs`) and scrapes the engines directly,
for figures only they know, such as queue depth. One query, whatever the
fleet size.
"""

from __future__ import annotations

import hmac

from django.conf import settings
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views.decorators.http import require_GET

from inventory.models import ReplicaState, Shard


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
    groups = [
        {
            "targets": [f"{addr or hostname or node}:{metrics_port or port}"],
            "labels": {"node": node, "shard": shard, "replica": replica, "model": model, "engine": engine},
        }
        for shard, port, metrics_port, node, addr, hostname, replica, model, engine in rows
    ]
    return JsonResponse(groups, safe=False)


def _authorized(request: HttpRequest) -> bool:
    """The same optional bearer token as /metrics: both tell a reader where the fleet is."""
    token = settings.LLMGW_METRICS_TOKEN
    if not token:
        return True
    given = request.headers.get("Authorization", "").removeprefix("Bearer ").strip()
    return hmac.compare_digest(given.encode(), token.encode())
