"""GET /metrics: the whole fleet, for Prometheus, behind an optional bearer token.

Prometheus' scrape (OpenMetrics, gzip) is answered from the fleet's part that
Celery beat rendered ahead (nodes/metrics/prerender.py) while it is young enough;
any other scrape, or one while no young render is stored, renders on request.
"""

from __future__ import annotations

import hmac
import logging
import time
from collections.abc import Generator, Iterator

from django.conf import settings
from django.db import DatabaseError
from django.http import HttpRequest, HttpResponse, StreamingHttpResponse
from django.views.decorators.http import require_GET
from prometheus_client import CollectorRegistry
from prometheus_client.exposition import gzip_accepted

from nodes.metrics import exposition, prerender
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
    accept = request.headers.get("Accept", "")
    compress = gzip_accepted(request.headers.get("Accept-Encoding", ""))
    chunks, content_type = exposition.write(REGISTRY, accept)
    if compress and (fleet := prerender.fetch(time.time(), content_type)) is not None:
        response = HttpResponse(fleet + prerender.own_counters(), content_type=content_type)
        response["Vary"] = "Accept-Encoding"
        response["Content-Encoding"] = "gzip"
        return response
    try:
        # The first chunk runs every query and the Redis round trip; a failure
        # there is answered as such instead of as a cut-off stream.
        first = next(chunks)
    except DatabaseError as exc:
        log.warning("/metrics: database unavailable: %s", exc)
        return HttpResponse("database unavailable\n", status=503, content_type="text/plain")
    stream = _stream(first, chunks)
    response = StreamingHttpResponse(_gzipped(stream) if compress else stream, content_type=content_type)
    response["Vary"] = "Accept-Encoding"
    if compress:
        response["Content-Encoding"] = "gzip"
    return response


def _stream(first: bytes, rest: Iterator[bytes]) -> Generator[bytes]:
    """A generator, so that the server closing the response closes the scrape too."""
    yield first
    yield from rest


def _gzipped(stream: Generator[bytes]) -> Iterator[bytes]:
    """Gzip as the stream goes, closing it however the response ends."""
    try:
        yield from prerender.gzip(stream)
    finally:
        stream.close()
