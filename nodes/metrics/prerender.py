"""The fleet's part of /metrics, rendered ahead by Celery beat and served from Redis.

At 10,000 nodes a scrape reads some 100,000 inventory rows and 10,000 loads and
writes 35 MB of text: about 0.4 s of a web worker's CPU on an idle machine, and
1–3 s of wall time while the same workers answer 2,000 heartbeats a second,
since the scrape waits for a core like every request (and holds a web worker
that heartbeats queue behind). So `nodes.tasks.render_metrics` renders the
fleet's families every LLMGW_METRICS_RENDER_PERIOD seconds in the Celery
worker, in the format Prometheus asks for (OpenMetrics 1.0.0), gzipped, and
stores it in Redis. A scrape that asks for that format with gzip gets it with
one GET, followed by the control plane's own counters read at that moment (a
second gzip member: a gzip stream may hold several, and every reader of the
format, Prometheus' included, reads them as one).

Freshness holds as on request: a stored render is served for at most
`valid_seconds()` after it was made (two periods, so one late beat does not
send scrapes back to rendering), and leaves out every load older than
LLMGW_LOAD_MAX_AGE minus that when it is made, so no load older than
LLMGW_LOAD_MAX_AGE is ever served. The inventory's series may lag the database
by as much; Prometheus samples them every 15 s anyway. Past that age (Celery
stopped), in any other format, or without gzip, the scrape renders on request
as before.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Iterable, Iterator
from typing import cast

import redis
from django.conf import settings
from prometheus_client import Metric

import livestate
from livestate import keys, selfmetrics
from nodes.metrics import exposition
from nodes.metrics.collector import FleetCollector, Scrape, self_families

# What Prometheus asks for (it prefers OpenMetrics 1.0.0).
PROMETHEUS_FORMAT = "application/openmetrics-text;version=1.0.0"

# In the Celery process: its row caches are kept from one render to the next.
_collector = FleetCollector()


def valid_seconds() -> float:
    return 2 * settings.LLMGW_METRICS_RENDER_PERIOD


class _Parts:
    """A registry of given families, for exposition.write."""

    def __init__(self, families: Iterable[Metric]):
        self.families = families

    def collect(self) -> Iterable[Metric]:
        return self.families


def gzip(chunks: Iterable[bytes]) -> Iterator[bytes]:
    """One gzip member, chunk by chunk. Level 1: the text shrinks some twenty times, at a tenth of level 6's CPU."""
    compressor = zlib.compressobj(1, zlib.DEFLATED, 31)
    for chunk in chunks:
        if packed := compressor.compress(chunk):
            yield packed
    yield compressor.flush()


def render(now: float) -> tuple[str, bytes]:
    """The fleet's families as Prometheus asks for them, gzipped, without the closing "# EOF"."""
    chunks, content_type = exposition.write(_Parts(_fleet_families(now)), PROMETHEUS_FORMAT, end=False)
    return content_type, b"".join(gzip(chunks))


def _fleet_families(now: float) -> Iterator[Metric]:
    """The scrape is taken when the first family is asked for, as a scrape on request takes it: inside
    exposition.write, so that the inventory is read with the cyclic collector paused (collections over its
    rows were a third of a render's CPU at 10,000 nodes)."""
    yield from _collector.fleet_families(Scrape.take(now, margin=valid_seconds()))


def store(now: float) -> int:
    """Render and store the fleet's part; its size in bytes."""
    content_type, packed = render(now)
    head = f"{now!r}\n{content_type}\n".encode()
    livestate.client().set(keys.METRICS_FLEET, head + packed, ex=math.ceil(valid_seconds()) + 1)
    return len(packed)


def fetch(now: float, content_type: str) -> bytes | None:
    """The stored fleet part if it is young enough and in this format; None means render on request."""
    try:
        raw = cast(bytes | None, livestate.client().get(keys.METRICS_FLEET))
    except redis.RedisError:
        return None
    if not raw:
        return None
    made, stored_type, packed = raw.split(b"\n", 2)
    if not 0 <= now - float(made) <= valid_seconds() or stored_type.decode() != content_type:
        return None
    return packed


def own_counters() -> bytes:
    """The control plane's own counters and OpenMetrics' "# EOF", gzipped: read on every scrape."""
    try:
        pipe = livestate.client().pipeline(transaction=False)
        selfmetrics.queue_read(pipe)
        counters = selfmetrics.read(pipe.execute()[-1])
    except redis.RedisError:
        counters = {}
    chunks, _ = exposition.write(_Parts(self_families(counters)), PROMETHEUS_FORMAT)
    return b"".join(gzip(chunks))
