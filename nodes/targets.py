"""Prometheus HTTP service discovery of the engines: where each running shard serves its own /metrics.

Prometheus polls this (`http_sd_configs`) and scrapes the engines directly,
for figures only they know, such as queue depth. One query, whatever the
fleet size.

A node must not choose what Prometheus scrapes: its agent's `mgmt_addr` and
hostname are only its claims, and could name any host. So a target's host is
the address the node's registrations and inventories came from
(`Node.source_addr`, as nodes/ratelimit.py `client_address` sees it), or its
`mgmt_addr` when that is an IP address inside one of the operator's
LLMGW_TRUSTED_TARGET_NETWORKS (for nodes whose traffic reaches the control
plane through a NAT or a proxy the hop count does not see past). A node with
neither has no target. Its port is the engine's, on that host.
"""

from __future__ import annotations

import ipaddress
import logging
from collections.abc import Sequence

from django.conf import settings
from django.db import DatabaseError
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views.decorators.http import require_GET

from inventory.models import ReplicaState, Shard

# The same optional bearer token as /metrics: both tell a reader where the fleet is.
from nodes.metrics.views import _authorized

log = logging.getLogger(__name__)

IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network


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
    trusted = settings.LLMGW_TRUSTED_TARGET_NETWORKS
    groups = []
    for shard, port, metrics_port, node, claimed, source, replica, model, engine, served in rows:
        host = scrape_host(claimed, source, trusted)
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


def scrape_host(claimed: str, source: str | None, trusted: Sequence[IPNetwork]) -> str | None:
    """Where to scrape a node: its claimed address inside a trusted network, else its source address, else nowhere."""
    try:
        address = ipaddress.ip_address(claimed)
    except ValueError:
        address = None
    if address is None or not any(address in network for network in trusted):
        address = ipaddress.ip_address(source) if source else None
    if address is None:
        return None
    return f"[{address}]" if address.version == 6 else str(address)
