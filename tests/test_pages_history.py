"""The node page's time ranges and its events over them, against a real Prometheus."""

from __future__ import annotations

import json
import re
from datetime import timedelta

import pytest
from django.utils import timezone

from devstack.polling import wait_until
from devstack.ports import free_port
from inventory.models import NodeEvent
from nodes import promquery
from nodes.views.node import MARKERS_SHOWN
from tests.factories import place
from tests.prometheus import ExpositionServer, PrometheusServer

HTMX = {"HTTP_HX_REQUEST": "true"}


@pytest.fixture
def viewer_client(client, viewer):
    client.force_login(viewer)
    return client


@pytest.fixture
def operator_client(client, operator):
    client.force_login(operator)
    return client


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory):
    exposition = ExpositionServer('llmgw_node_cpu_utilization_percent{node="ready-1"} 42.5\n').start()
    server = PrometheusServer(tmp_path_factory.mktemp("prometheus"), f"127.0.0.1:{exposition.port}").start()
    wait_until(lambda: server.samples('llmgw_node_cpu_utilization_percent{node="ready-1"}') >= 2, 30, "two scrapes")
    yield server
    server.stop()
    exposition.stop()


@pytest.mark.parametrize(("key", "step"), [("1h", 15), ("6h", 30), ("24h", 120), ("7d", 900)])
def test_each_range_asks_at_most_a_thousand_points_with_the_finest_step_that_allows(key, step):
    time_range = promquery.RANGES[key]
    assert time_range.step == step
    assert time_range.span // step + 1 <= promquery.MAX_POINTS
    finer = [s for s in promquery.STEPS if s < step]
    assert all(time_range.span // s + 1 > promquery.MAX_POINTS for s in finer)


def chart_data(response) -> dict:
    html = response.content.decode()
    return json.loads(re.search(r'<script id="chart-data" type="application/json">(.*?)</script>', html).group(1))


@pytest.mark.parametrize("key", ["1h", "7d"])
def test_charts_over_a_range_come_from_prometheus_on_its_grid(viewer_client, cluster, settings, prometheus, key):
    settings.PROMETHEUS_URL = prometheus.url
    time_range = promquery.RANGES[key]
    response = viewer_client.get(f"/nodes/ready-1/charts/?range={key}", **HTMX)
    assert response.status_code == 200
    data = chart_data(response)
    times = data["times"]
    assert len(times) == time_range.span // time_range.step + 1
    assert times[-1] - times[0] == time_range.span
    cpu = next(chart for chart in data["charts"] if chart["key"] == "cpu")
    # The newest point is the value Prometheus scraped; a week ago it had none.
    assert cpu["values"][0][-1] == 42.5
    assert cpu["values"][0][0] is None
    html = response.content.decode()
    # The refresh asks again for the same range.
    assert f'hx-get="/nodes/ready-1/charts/?range={key}"' in html
    assert f"Events in the last {time_range.label}" in html


def test_the_page_links_each_range_and_hands_the_chosen_one_to_its_charts(viewer_client, cluster):
    html = viewer_client.get("/nodes/ready-1/?range=24h").content.decode()
    assert '<a id="range-24h" href="?range=24h" aria-current="page">24 h</a>' in html
    assert '<a id="range-1h" href="?range=1h">1 h</a>' in html
    assert 'hx-get="/nodes/ready-1/charts/?range=24h" hx-trigger="load, every 30s"' in html
    default = viewer_client.get("/nodes/ready-1/").content.decode()
    assert 'id="range-1h" href="?range=1h" aria-current="page"' in default
    # A template comment over several lines once showed on the page as text.
    assert "{#" not in html and "Loaded after the page" not in html


def test_an_unknown_range_falls_back_to_an_hour_and_says_so(viewer_client, cluster):
    response = viewer_client.get("/nodes/ready-1/?range=<b>2d")
    assert response.status_code == 200
    html = response.content.decode()
    assert "range: &#x27;&lt;b&gt;2d&#x27; is not one of 1h, 6h, 24h, 7d; showing 1 h." in html
    assert 'hx-get="/nodes/ready-1/charts/?range=1h"' in html


@pytest.mark.parametrize("value", ["2d", "", "1H", "7d\x00"])
def test_the_charts_endpoint_refuses_an_unknown_range_by_name(viewer_client, cluster, value):
    response = viewer_client.get("/nodes/ready-1/charts/", {"range": value}, **HTMX)
    assert response.status_code == 400
    assert response.content.decode() == "range: must be one of 1h, 6h, 24h, 7d"


def test_a_cordon_made_on_the_page_is_an_event_of_the_range(operator_client, cluster, settings):
    settings.PROMETHEUS_URL = f"http://127.0.0.1:{free_port()}"
    response = operator_client.post(
        "/nodes/ready-1/admin-state/", {"action": "cordon", "reason": "NIC flapping <script>x</script>"}
    )
    assert response.status_code in (302, 303)
    html = operator_client.get("/nodes/ready-1/charts/?range=1h", **HTMX).content.decode()
    # Prometheus is down: no charts, but the events are still listed.
    assert "History is unavailable" in html
    listed = re.search(r'<ol class="events compact chart-events">(.*?)</ol>', html, re.S).group(1)
    assert "Admin: active → cordoned · “NIC flapping &lt;script&gt;x&lt;/script&gt;” — operator" in listed
    assert "<script>x" not in html


def test_events_are_those_of_the_range_and_ride_with_the_chart_data(viewer_client, cluster, settings, prometheus):
    settings.PROMETHEUS_URL = prometheus.url
    node = cluster["ready-1"]
    now = timezone.now()
    NodeEvent.objects.create(node=node, at=now - timedelta(hours=3), kind="liveness", to_state="unreachable")
    NodeEvent.objects.create(
        node=node,
        at=now - timedelta(minutes=5),
        kind="admin",
        from_state="active",
        to_state="cordoned",
        reason="</script><b>x</b>",
        actor="alice",
    )
    hour = chart_data(viewer_client.get("/nodes/ready-1/charts/?range=1h", **HTMX))
    assert [e["text"] for e in hour["events"]] == ["Admin: active → cordoned · “</script><b>x</b>” — alice"]
    six = chart_data(viewer_client.get("/nodes/ready-1/charts/?range=6h", **HTMX))
    assert [e["kind"] for e in six["events"]] == ["liveness", "admin"]
    assert six["times"][0] <= six["events"][0]["t"] <= six["times"][-1]


def test_markers_are_the_newest_of_a_busy_range(viewer_client, cluster, settings):
    settings.PROMETHEUS_URL = f"http://127.0.0.1:{free_port()}"
    now = timezone.now()
    NodeEvent.objects.bulk_create(
        NodeEvent(node=cluster["lost-1"], at=now - timedelta(seconds=i), kind="liveness", to_state=f"s{i}")
        for i in range(1, MARKERS_SHOWN + 11)
    )
    html = viewer_client.get("/nodes/lost-1/charts/?range=1h", **HTMX).content.decode()
    assert html.count('<li id="event-') == MARKERS_SHOWN
    assert "→ s1<" in html
    assert f"→ s{MARKERS_SHOWN + 1}<" not in html


def test_a_shard_placed_on_the_node_is_an_event(viewer_client, cluster, settings):
    settings.PROMETHEUS_URL = f"http://127.0.0.1:{free_port()}"
    place("llama", {"ready-1": [0]})
    html = viewer_client.get("/nodes/ready-1/charts/?range=1h", **HTMX).content.decode()
    assert "Replica: pending → placed · “replica llama-r1: placed” — system" in html
    assert "llama-r1" not in viewer_client.get("/nodes/lost-1/charts/?range=1h", **HTMX).content.decode()
