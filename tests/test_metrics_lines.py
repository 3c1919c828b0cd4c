"""Lines written ahead of the scrape are exactly what prometheus_client would write."""

from __future__ import annotations

import time

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.openmetrics import exposition as om_exposition
from prometheus_client.openmetrics.parser import text_string_to_metric_families as parse_openmetrics
from prometheus_client.parser import text_string_to_metric_families as parse_text

from agent import protocol
from livestate import loadlines, loadstore
from livestate.samples import labelset, line
from nodes.metrics.rowcache import RowCache
from tests.metrics_scrape import TEXT, body

OPENMETRICS = "application/openmetrics-text; version=1.0.0"


class Given:
    def __init__(self, families):
        self.families = families

    def collect(self):
        return self.families


def registry_of(families) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(Given(list(families)))
    return registry


@pytest.mark.parametrize(
    "value", ["plain", 'a "quoted" word', "back\\slash", "new\nline", "ünïcødé ✓", "", "tab\there", "\\n literal"]
)
@pytest.mark.parametrize("number", [0, 1, 0.1, 37.5, 512 * 2**30, 2**53, 1e-7, float("inf")])
def test_a_line_is_what_prometheus_client_writes(value, number):
    family = GaugeMetricFamily("x_bytes", "help", labels=["node", "a_label"])
    family.add_metric([value, "second"], number)
    expected = generate_latest(registry_of([family])).decode().splitlines(keepends=True)[2]
    assert line("x_bytes", labelset(node=value, a_label="second"), number) == expected


@pytest.fixture
def populated(cluster, redis_client):
    from livestate import selfmetrics
    from tests.factories import place

    place("s", {"ready-1": [0, 1]}, memory_gb=16, model='odd "model"\\name')
    load = protocol.Load(
        cpu_percent=99.5,
        cpus=8,
        load1=0.01,
        memory_used_bytes=1,
        memory_available_bytes=2**40,
        shards=[protocol.ShardLoad(shard="s-r1-s0", cpu_cores=0.3, rss_bytes=123456789)],
    )
    loadstore.save("ready-1", load, time.time())
    loadstore.save("cordoned-1", protocol.Load(cpu_percent=0, cpus=1), time.time())
    selfmetrics.record(selfmetrics.heartbeat_fields("accepted", 0.002))
    selfmetrics.record(selfmetrics.heartbeat_fields("too_large", 0.2))
    return cluster


def test_the_text_format_is_byte_for_byte_prometheus_clients(client, populated):
    ours = body(client.get("/metrics", headers={"Accept": TEXT}))
    assert generate_latest(registry_of(parse_text(ours))).decode() == ours


def test_openmetrics_is_negotiated_and_byte_for_byte_prometheus_clients(client, populated):
    response = client.get("/metrics", headers={"Accept": OPENMETRICS})
    assert response["Content-Type"].startswith("application/openmetrics-text; version=1.0.0")
    ours = body(response)
    assert ours.endswith("# EOF\n") and ours.count("# EOF") == 1
    assert om_exposition.generate_latest(registry_of(parse_openmetrics(ours))).decode() == ours
    assert "# TYPE llmgw_node info\n" in ours


def test_without_an_accept_header_the_classic_text_format(client, populated):
    response = client.get("/metrics")
    assert response["Content-Type"] == "text/plain; version=0.0.4; charset=utf-8"
    assert "# TYPE llmgw_node_info gauge\n" in body(response)


def test_a_rendered_load_reads_back():
    load = protocol.Load(
        cpu_percent=5,
        cpus=4,
        shards=[protocol.ShardLoad(shard="a", cpu_cores=1.25, rss_bytes=10), protocol.ShardLoad(shard="b")],
    )
    stored = loadlines.parse(loadlines.render("n-1", load, 1234.5))
    assert stored.received_at == 1234.5
    assert stored.chunks[1] == b'llmgw_node_cpus{node="n-1"} 4.0\n'
    assert stored.chunks[2].count(b"\n") == 3
    assert stored.shards == [[b"a", b"1.25", b"10.0"], [b"b", b"0.0", b"0.0"]]


@pytest.mark.parametrize(
    "raw", [None, b"", b"garbage", b"12\nx", b"nan-ish\n" + b"\x1e" * 5, b"1\n\x1e\x1e\x1e\x1e\x1ea\x1fb\n"]
)
def test_an_unreadable_rendered_load_is_skipped(raw):
    assert loadlines.parse(raw) is None


def recording_cache() -> tuple[RowCache, list]:
    """A row cache, and the rows it rendered, in order."""
    rendered: list = []

    def render(row):
        rendered.append(row)
        return f"text of {row}"

    return RowCache(render), rendered


def test_a_row_is_rendered_again_only_when_it_changed():
    cache, rendered = recording_cache()
    assert cache.refresh([("a", 1), ("b", 2)]) == ["text of ('a', 1)", "text of ('b', 2)"]
    assert cache.refresh([("a", 1), ("b", 3)]) == ["text of ('a', 1)", "text of ('b', 3)"]
    assert rendered == [("a", 1), ("b", 2), ("b", 3)]
    cache.refresh([("b", 3)])
    assert list(cache.entries) == [("b", 3)]


@pytest.mark.parametrize(
    ("accept", "content_type"),
    [
        ("application/openmetrics-text; version=abc", "text/plain; version=0.0.4"),
        ("text/plain; version=x.y", "text/plain; version=0.0.4"),
        ("*/*", "text/plain; version=0.0.4"),
        ("application/openmetrics-text; version=0.0.1", "text/plain; version=0.0.4"),
        ("text/plain; version=1.0.0; escaping=allow-utf-8", "text/plain; version=1.0.0"),
        ("application/openmetrics-text; version=2.0.0", "application/openmetrics-text; version=2.0.0"),
    ],
)
def test_any_accept_header_gets_a_readable_answer(client, populated, accept, content_type):
    response = client.get("/metrics", headers={"Accept": accept})
    assert response.status_code == 200
    assert response["Content-Type"].startswith(content_type)
    text = body(response)
    parse = parse_openmetrics if content_type.startswith("application/openmetrics-text") else parse_text
    assert any(family.name == "llmgw_node_cpus" for family in parse(text))


def test_gzip_when_the_scraper_accepts_it(client, populated):
    import gzip

    plain = client.get("/metrics", headers={"Accept": TEXT})
    assert "Content-Encoding" not in plain
    packed = client.get("/metrics", headers={"Accept": TEXT, "Accept-Encoding": "gzip"})
    assert packed["Content-Encoding"] == "gzip"
    assert packed["Vary"] == "Accept-Encoding"
    assert gzip.decompress(b"".join(packed.streaming_content)).decode() == body(plain)


def test_rows_unchanged_since_the_last_refresh_give_the_last_answer_and_render_nothing():
    cache, rendered = recording_cache()
    first = cache.refresh([("a", 1), ("b", 2)])
    assert cache.refresh(iter([("a", 1), ("b", 2)])) is first
    assert rendered == [("a", 1), ("b", 2)]
    assert cache.refresh([("a", 1)]) == ["text of ('a', 1)"]
    assert cache.refresh([("a", 1), ("b", 2)]) == first, "a row forgotten is rendered again when it comes back"
    assert rendered == [("a", 1), ("b", 2), ("b", 2)]
