"""The operator pages in a real Chromium: bars, refreshing in place, navigation, and charts from a real Prometheus."""

from __future__ import annotations

import time

import pytest
import requests
from django.utils import timezone

from agent import protocol
from agent.protocol import GPULoad, Load, ShardLoad
from devstack.polling import wait_until
from inventory.liveness import change_liveness, flush
from inventory.models import Allocation, GPUClaim, Liveness
from livestate import loadstore
from tests.browser.conftest import log_in
from tests.factories import make_inventory
from tests.prometheus import ExpositionServer, PrometheusServer

pytestmark = [pytest.mark.browser, pytest.mark.slow, pytest.mark.django_db(transaction=True)]

GIB = 2**30


def load(cpu: float, used_gib: int, available_gib: int, load1: float = 1.0) -> Load:
    return Load(
        cpu_percent=cpu,
        cpus=64,
        load1=load1,
        memory_used_bytes=used_gib * GIB,
        memory_available_bytes=available_gib * GIB,
    )


def bar_fraction(page, row_id: str, column: str) -> float:
    """How much of its track a bar fills, as the browser laid it out."""
    return page.evaluate(
        """([row, column]) => {
            const bar = document.querySelector(`#node-${row} td.${column} .bar`);
            return bar.querySelector('.fill').getBoundingClientRect().width / bar.getBoundingClientRect().width;
        }""",
        [row_id, column],
    )


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory):
    """A real Prometheus scraping ready-1's figures every second, started early so that
    it holds more than one chart step of samples by the time the chart test runs."""
    exposition = ExpositionServer(
        'llmgw_node_cpu_utilization_percent{node="ready-1"} 37.5\n'
        'llmgw_node_memory_used_bytes{node="ready-1"} 137438953472\n'
        'llmgw_node_memory_available_bytes{node="ready-1"} 412316860416\n'
        'llmgw_node_load{node="ready-1",window="1m"} 2.5\n'
    ).start()
    server = PrometheusServer(tmp_path_factory.mktemp("prometheus"), f"127.0.0.1:{exposition.port}").start()
    yield server
    server.stop()
    exposition.stop()


def test_cluster_page_bars_match_the_values(page, live_server, operator, cluster, redis_client, prometheus):
    now = time.time()
    loadstore.save("ready-1", load(42.0, used_gib=128, available_gib=384), now)
    loadstore.save("cordoned-1", load(87.5, used_gib=480, available_gib=32), now)
    log_in(page, live_server.url, "operator", "operator-pass")
    assert page.locator("#node-ready-1 td.cpu .figure").inner_text() == "42% · 26.9/64"
    assert bar_fraction(page, "ready-1", "cpu") == pytest.approx(0.42, abs=0.01)
    assert bar_fraction(page, "ready-1", "ram") == pytest.approx(0.25, abs=0.01)
    assert bar_fraction(page, "cordoned-1", "cpu") == pytest.approx(0.88, abs=0.01)
    assert bar_fraction(page, "cordoned-1", "ram") == pytest.approx(480 / 512, abs=0.01)
    # No load for the unreachable node: a dash, and the reason on hover.
    assert page.locator("#node-unreachable-1 td.cpu").inner_text() == "—"
    assert page.locator("#node-unreachable-1 td.cpu").get_attribute("title") == "no load reported"


def post(url: str, message, token: str) -> dict:
    response = requests.post(
        url,
        data=protocol.encode(message),
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
        timeout=10,
    )
    assert response.status_code == 200, response.text
    return response.json()


def test_a_heartbeat_changes_the_table_without_a_reload(page, live_server, operator, cluster, redis_client, settings):
    # A node joins through the agent API, then goes silent and is marked unreachable, as the sweeper would.
    settings.LLMGW_JOIN_TOKEN = "join-token-for-the-browser-test"
    registered = post(
        f"{live_server.url}/api/v1/register",
        protocol.Register(node_id="fresh-1", inventory=make_inventory("fresh-1.example", gpus=8)),
        settings.LLMGW_JOIN_TOKEN,
    )
    change_liveness("fresh-1", Liveness.ALIVE, Liveness.UNREACHABLE, "no heartbeat", timezone.now())

    # A short window, so the page scrolls and the test can see the position survive.
    page.set_viewport_size({"width": 1280, "height": 240})
    log_in(page, live_server.url, "operator", "operator-pass")
    row = page.locator("#node-fresh-1")
    assert row.locator("[data-state]").get_attribute("data-state") == "unreachable"
    assert row.locator("td.cpu").inner_text() == "—"
    assert page.locator('[data-count="ready"]').inner_text() == "1"
    page.evaluate("window.__notReloaded = 'still here'")
    page.evaluate("window.scrollTo(0, 100)")
    scrolled = page.evaluate("window.scrollY")
    assert scrolled > 0

    # The node's agent posts a real heartbeat: a new inventory and a load.
    reply = post(
        f"{live_server.url}/api/v1/heartbeat",
        protocol.Heartbeat(
            inventory=make_inventory("back-again.example", gpus=8),
            inventory_hash="second",
            load=load(73.0, used_gib=256, available_gib=256),
        ),
        registered["token"],
    )
    assert reply["state"] == "ready"
    # The revival reaches the database with the sweep's next flush, as Celery beat runs it every 5 s.
    flush()

    row.locator("td.cpu .figure").wait_for(timeout=15_000)
    assert row.locator("td.cpu .figure").inner_text().startswith("73%")
    assert row.locator("td.hostname").inner_text() == "back-again.example"
    assert row.locator("[data-state]").get_attribute("data-state") == "ready"
    # The summary came along out of band.
    page.wait_for_function("document.querySelector('[data-count=\"ready\"]').textContent === '2'")
    assert page.evaluate("window.__notReloaded") == "still here"
    assert page.evaluate("window.scrollY") == scrolled


def test_clicking_a_node_opens_its_page(page, live_server, operator, cluster, redis_client):
    log_in(page, live_server.url, "operator", "operator-pass")
    page.click("#node-cordoned-1 td:first-child a")
    page.wait_for_url(f"{live_server.url}/nodes/cordoned-1/")
    assert page.locator("h1").inner_text().startswith("cordoned-1")
    assert page.locator("#node-live [data-state]").first.get_attribute("data-state") == "cordoned"


def test_charts_draw_what_prometheus_scraped_from_our_metrics(
    page, live_server, operator, cluster, redis_client, settings, tmp_path
):
    """End to end: our /metrics, scraped by a real Prometheus, drawn on the node page."""
    allocation = Allocation.objects.create(
        node=cluster["ready-1"], shard_id="s0", replica_id="r0", model="llama-3-8b", memory_gb=16
    )
    GPUClaim.objects.create(allocation=allocation, node=cluster["ready-1"], gpu_index=0)
    loaded = Load(
        cpu_percent=61.0,
        cpus=64,
        memory_used_bytes=100 * GIB,
        memory_available_bytes=412 * GIB,
        shards=[ShardLoad(shard="s0", cpu_cores=2.5, rss_bytes=12 * GIB)],
        gpus=[GPULoad(index=0, uuid="GPU-ready-1.example-0", utilization_percent=87.0, memory_used_bytes=61 * GIB)],
    )
    loadstore.save("ready-1", loaded, time.time())
    target = live_server.url.removeprefix("http://")
    prometheus = PrometheusServer(tmp_path / "prometheus", target).start()
    try:
        settings.PROMETHEUS_URL = prometheus.url
        for selector in (
            'llmgw_node_cpu_utilization_percent{node="ready-1"}',
            'llmgw_shard_cpu_cores{model="llama-3-8b"}',
            'llmgw_gpu_utilization_percent{node="ready-1"}',
        ):
            wait_until(lambda s=selector: prometheus.samples(s) >= 2, 30, f"two scrapes of {selector}")
        log_in(page, live_server.url, "operator", "operator-pass", path="/nodes/ready-1/")
        drawn = (("cpu", "61%"), ("cores", "2.50"), ("shard_memory", "12 GiB"), ("gpu_utilization", "87%"))
        for key, value in (*drawn, ("gpu_memory", "61 GiB")):
            chart = page.locator(f'.chart[data-key="{key}"][data-drawn="true"]')
            chart.wait_for()
            assert int(chart.get_attribute("data-points")) >= 1
            chart.scroll_into_view_if_needed()
            box = chart.locator(".u-over").bounding_box()
            page.mouse.move(box["x"] + box["width"] - 1, box["y"] + box["height"] / 2)
            assert chart.locator(".u-legend .u-series").nth(1).locator(".u-value").inner_text() == value
        cores_legend = page.locator('.chart[data-key="cores"] .u-legend .u-series').nth(1)
        assert "llama-3-8b" in cores_legend.inner_text()
    finally:
        prometheus.stop()


def test_charts_draw_history_from_a_real_prometheus(
    page, live_server, operator, cluster, redis_client, prometheus, settings
):
    settings.PROMETHEUS_URL = prometheus.url
    # At least two scrapes, and the first one a chart step (15 s) ago, so the line has two points.
    selector = 'llmgw_node_cpu_utilization_percent{node="ready-1"}'
    wait_until(lambda: prometheus.samples(selector) >= 17, 40, "Prometheus to hold 17 s of scrapes")
    loadstore.save("ready-1", load(37.5, used_gib=128, available_gib=384), time.time())

    log_in(page, live_server.url, "operator", "operator-pass", path="/nodes/ready-1/")
    cpu = page.locator('.chart[data-key="cpu"][data-drawn="true"]')
    cpu.wait_for()
    assert int(cpu.get_attribute("data-points")) >= 2
    assert page.locator('.chart[data-key="memory"]').get_attribute("data-points") not in (None, "0")
    # Point at the newest sample: uPlot's legend reads the value it drew there.
    # (The alerts line and the range links above may put the chart below the fold.)
    cpu.scroll_into_view_if_needed()
    box = cpu.locator(".u-over").bounding_box()
    page.mouse.move(box["x"] + box["width"] - 1, box["y"] + box["height"] / 2)
    assert cpu.locator(".u-legend .u-series").nth(1).locator(".u-value").inner_text() == "38%"

    # Prometheus stops: the page still renders its live numbers and says why there is no history.
    prometheus.stop()
    page.reload()
    page.locator(".history-unavailable").wait_for()
    assert "History is unavailable: Prometheus at" in page.locator(".history-unavailable").inner_text()
    assert page.locator("#cpu-percent").inner_text() == "37.5%"
