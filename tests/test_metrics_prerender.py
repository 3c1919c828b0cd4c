"""Prometheus' scrape served from the fleet part Celery beat renders ahead: the same samples, never a stale load."""

from __future__ import annotations

import gzip

import pytest
import time_machine
from django.http import StreamingHttpResponse
from prometheus_client.openmetrics.parser import text_string_to_metric_families as parse_openmetrics

from inventory.models import Node
from livestate import loadstore, selfmetrics
from nodes.tasks import render_metrics
from tests.factories import place
from tests.metrics_scrape import TEXT
from tests.test_metrics import T0, a_load

pytestmark = pytest.mark.django_db

PROMETHEUS = {
    "Accept": "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,"
    "text/plain;version=0.0.4;q=0.5,*/*;q=0.1",
    "Accept-Encoding": "gzip",
}


def text_of(response) -> str:
    assert response.status_code == 200
    raw = b"".join(response.streaming_content) if response.streaming else response.content
    return (gzip.decompress(raw) if response.get("Content-Encoding") == "gzip" else raw).decode()


def samples(text: str) -> dict:
    return {(s.name, frozenset(s.labels.items())): s.value for f in parse_openmetrics(text) for s in f.samples}


def nodes_in(text: str) -> set[str]:
    return {labels["node"] for f in parse_openmetrics(text) for s in f.samples if (labels := s.labels).get("node")}


@pytest.fixture
def placed(cluster, redis_client):
    place("llama", {"ready-1": [0, 1]}, memory_gb=64, model="meta-llama/Llama-3.1-8B")
    loadstore.save("ready-1", a_load(), received_at=T0)
    return cluster


def test_a_prometheus_scrape_gets_the_render_with_the_samples_a_live_scrape_has(client, placed):
    with time_machine.travel(T0 + 1, tick=False):
        live = client.get("/metrics", headers=PROMETHEUS)
        assert isinstance(live, StreamingHttpResponse), "nothing rendered yet: rendered on request"
        live_text = text_of(live)
        assert render_metrics() > 0
        served = client.get("/metrics", headers=PROMETHEUS)
    assert not served.streaming
    text = text_of(served)
    assert text.endswith("# EOF\n") and text.count("# EOF") == 1
    assert samples(text) == samples(live_text)
    assert ("llmgw_node_cpus", frozenset({("node", "ready-1")})) in samples(text)


def test_the_control_planes_own_counters_are_read_at_each_scrape(client, placed):
    with time_machine.travel(T0 + 1, tick=False):
        render_metrics()
        before = samples(text_of(client.get("/metrics", headers=PROMETHEUS)))
        selfmetrics.record(selfmetrics.heartbeat_fields("accepted", 0.001))
        after = samples(text_of(client.get("/metrics", headers=PROMETHEUS)))
    accepted = ("llmgw_heartbeats_accepted_total", frozenset())
    assert after[accepted] == before[accepted] + 1


def test_a_render_is_served_only_while_it_is_young(client, placed, settings):
    with time_machine.travel(T0 + 1, tick=False):
        render_metrics()
    Node.objects.filter(pk="cordoned-1").delete()
    valid = 2 * settings.LLMGW_METRICS_RENDER_PERIOD
    with time_machine.travel(T0 + 1 + valid, tick=False):
        assert "cordoned-1" in nodes_in(text_of(client.get("/metrics", headers=PROMETHEUS))), "the render, lagging"
    with time_machine.travel(T0 + 1.5 + valid, tick=False):
        assert "cordoned-1" not in nodes_in(text_of(client.get("/metrics", headers=PROMETHEUS))), "rendered anew"


def test_a_render_leaves_out_loads_that_would_pass_their_age_while_it_is_served(client, placed, settings):
    settings.LLMGW_LOAD_MAX_AGE = 60
    valid = 2 * settings.LLMGW_METRICS_RENDER_PERIOD
    cpus = ("llmgw_node_cpus", frozenset({("node", "ready-1")}))
    with time_machine.travel(T0 + 60 - valid, tick=False):
        render_metrics()
    with time_machine.travel(T0 + 60, tick=False):
        assert cpus in samples(text_of(client.get("/metrics", headers=PROMETHEUS))), "60 s old at most"
    with time_machine.travel(T0 + 60 - valid + 0.5, tick=False):
        render_metrics()
    with time_machine.travel(T0 + 60 + 0.5, tick=False):
        assert cpus not in samples(text_of(client.get("/metrics", headers=PROMETHEUS)))


@pytest.mark.parametrize(
    "headers", [{"Accept": TEXT, "Accept-Encoding": "gzip"}, {"Accept": PROMETHEUS["Accept"]}], ids=["text", "plain"]
)
def test_other_formats_and_uncompressed_scrapes_are_rendered_on_request(client, placed, headers):
    with time_machine.travel(T0 + 1, tick=False):
        render_metrics()
        Node.objects.filter(pk="cordoned-1").delete()
        response = client.get("/metrics", headers=headers)
    assert response.streaming
    raw = b"".join(response.streaming_content)
    text = (gzip.decompress(raw) if response.get("Content-Encoding") == "gzip" else raw).decode()
    assert 'node="ready-1"' in text and 'node="cordoned-1"' not in text


def test_celery_beat_renders_metrics_within_their_period(settings):
    entry = settings.CELERY_BEAT_SCHEDULE["render-metrics"]
    assert entry["task"] == render_metrics.name
    assert entry["schedule"] == settings.LLMGW_METRICS_RENDER_PERIOD


def test_a_render_reads_the_inventory_with_the_cyclic_collector_paused(placed, monkeypatch):
    import gc

    from nodes.metrics import inventory_series

    read, seen = inventory_series.read, []

    def read_and_look():
        seen.append(gc.isenabled())
        return read()

    monkeypatch.setattr(inventory_series, "read", read_and_look)
    assert gc.isenabled()
    with time_machine.travel(T0 + 1, tick=False):
        render_metrics()
    assert seen == [False], "some 200,000 rows at 10,000 nodes: walked by every collection (docs/operations.md)"
    assert gc.isenabled()
