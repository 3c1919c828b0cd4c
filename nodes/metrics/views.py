"""GET /metrics: the whole fleet, for Prometheus, behind an optional bearer token."""

from __future__ import annotations

import hmac
import logging
from collections.abc import Iterator

from django.conf import settings
from django.db import DatabaseError
from django.http import HttpRequest, HttpResponse, StreamingHttpResponse
from django.views.decorators.http import require_GET
from prometheus_client import CollectorRegistry

from nodes.metrics import exposition
from nodes.metrics.collector import FleetCollector

log = logging.getLogger(__name__)

# Registering calls describe(), which runs no query, so importing this module is free.
REGISTRY = CollectorRegistry(auto_describe=False)
REGISTRY.register(FleetCollector())


def _authorized(request: HttpRequest) -> bool:
    token = settings.LLMGW_METRICS_TOKEN
    if not token:
        return True
    scheme, _, given = request.headers.get("Authorization", "").partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(given.strip().encode(), token.encode())


@require_GET
def metrics(request: HttpRequest) -> HttpResponse:
    if not _authorized(request):
        return HttpResponse(
            "bearer token required\n", status=401, headers={"WWW-Authenticate": 'Bearer realm="metrics"'}
        )
    chunks, content_type = exposition.write(REGISTRY, request.headers.get("Accept", ""))
    try:
        # The first chunk runs every query and the Redis round trip; a failure
        # there is answered as such instead of as a cut-off stream.
        first = next(chunks)
    except DatabaseError as exc:
        log.warning("/metrics: database unavailable: %s", exc)
        return HttpResponse("database unavailable\n", status=503, content_type="text/plain")
    return StreamingHttpResponse(_stream(first, chunks), content_type=content_type)


def _stream(first: bytes, rest: Iterator[bytes]) -> Iterator[bytes]:
    """A generator, so that the server closing the response closes the scrape too."""
    yield first
    yield from rest
