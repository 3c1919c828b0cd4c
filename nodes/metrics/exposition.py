"""Writing a registry in the format the scraper asked for, with pre-rendered families.

prometheus_client chooses the format from the Accept header and writes every
header and every ordinary family. A `RenderedFamily` carries sample lines that
are already written (livestate.samples renders them exactly as
prometheus_client would); here they are joined under the header
prometheus_client wrote for the family. Gauge and info sample lines read the
same in the classic text format and in OpenMetrics, which is what makes lines
rendered ahead of the scrape valid in whichever format it asks for.

The answer is produced one family at a time, so the web process never holds
the whole text of a 10,000-node fleet at once.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from functools import lru_cache

from prometheus_client import Metric
from prometheus_client.exposition import choose_encoder

from lib import collector

EOF_LINE = b"# EOF\n"


class RenderedFamily(Metric):
    """A gauge or info family whose samples are given as ready sample lines."""

    def __init__(self, name: str, documentation: str, typ: str, chunks: Iterable[bytes]):
        if typ not in ("gauge", "info"):
            raise ValueError(f"only gauge and info lines are the same in every format, not {typ}")
        super().__init__(name, documentation, typ)
        self.chunks = chunks


class _One:
    """A registry of one family, for prometheus_client's encoders."""

    def __init__(self, metric: Metric):
        self.metric = metric

    def collect(self) -> list[Metric]:
        return [self.metric]


def _encode(encoder, metric: Metric) -> bytes:
    text = encoder(_One(metric))
    # OpenMetrics ends every document with "# EOF"; only the last may have it.
    return text.removesuffix(EOF_LINE)


@lru_cache(maxsize=1024)
def _header(content_type: str, name: str, documentation: str, typ: str) -> bytes:
    encoder, _ = choose_encoder(content_type)
    return _encode(encoder, Metric(name, documentation, typ))


def write(registry, accept: str, end: bool = True) -> tuple[Iterator[bytes], str]:
    """The registry's families as byte chunks in the negotiated format, and its content type.

    The chunks are produced lazily: the collectors run when the first is asked for.
    `end` False leaves out OpenMetrics' closing "# EOF", for a part that others follow.
    """
    try:
        encoder, content_type = choose_encoder(accept)
    except (TypeError, ValueError):
        # prometheus_client compares version numbers it could not parse
        # ("version=abc"); such a scraper gets the format every scraper reads.
        encoder, content_type = choose_encoder("")
    return _chunks(registry, encoder, content_type, end), content_type


def _chunks(registry, encoder, content_type: str, end: bool = True) -> Iterator[bytes]:
    # A scrape of a large fleet makes hundreds of thousands of short-lived
    # objects without cycles (rows, byte strings), freed by reference counting;
    # the cyclic collector would only walk them over and over, a fifth of the
    # scrape's CPU at 10,000 nodes. It is paused for the scrape and restored
    # however the scrape ends (exhausted, failed, or closed by the server).
    with collector.paused():
        for metric in registry.collect():
            if isinstance(metric, RenderedFamily):
                header = _header(content_type, metric.name, metric.documentation, metric.type)
                yield header + b"".join(metric.chunks)
            else:
                yield _encode(encoder, metric)
        if end and content_type.startswith("application/openmetrics-text"):
            yield EOF_LINE
