"""The node page's history in a real Chromium: event markers, the range switch, and refreshes
that keep the reader's range, focus, selection and scroll position.

Tests that wait for a refresh install Playwright's clock, so thirty seconds of
polling pass at once; the requests themselves go to the live server as usual.
"""

from __future__ import annotations

import pytest

from devstack.polling import wait_until
from tests.browser.conftest import log_in
from tests.prometheus import ExpositionServer, PrometheusServer

pytestmark = [pytest.mark.browser, pytest.mark.slow, pytest.mark.django_db(transaction=True)]

CHARTS_POLL_MS = 31_000
TABLE_POLL_MS = 6_000


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory):
    """ready-1's CPU, RAM and load, scraped every second, so every node chart but the per-model ones draws."""
    exposition = ExpositionServer(
        'llmgw_node_cpu_utilization_percent{node="ready-1"} 37.5\n'
        'llmgw_node_memory_used_bytes{node="ready-1"} 137438953472\n'
        'llmgw_node_memory_available_bytes{node="ready-1"} 412316860416\n'
        'llmgw_node_load{node="ready-1",window="1m"} 2.5\n'
    ).start()
    server = PrometheusServer(tmp_path_factory.mktemp("prometheus"), f"127.0.0.1:{exposition.port}").start()
    wait_until(lambda: server.samples('llmgw_node_load{node="ready-1"}') >= 2, 30, "two scrapes of ready-1's figures")
    yield server
    server.stop()
    exposition.stop()


@pytest.fixture
def clocked(page):
    page.clock.install()
    return page


def swapped(page, selector: str):
    """Remember the element now under `selector`; the returned check is true once a refresh replaced it."""
    page.evaluate("s => { window.__before = document.querySelector(s); }", selector)
    return lambda: page.wait_for_function("s => document.querySelector(s) !== window.__before", arg=selector)


def test_a_cordon_made_here_is_a_marker_on_every_chart_with_its_reason_on_hover(
    page, live_server, operator, cluster, settings, prometheus
):
    settings.PROMETHEUS_URL = prometheus.url
    reason = "NIC flapping on port 2 <img src=x onerror=alert(1)>"
    log_in(page, live_server.url, "operator", "operator-pass", path="/nodes/ready-1/")
    page.fill("input[name=reason]", reason)
    page.click("button[value=cordon]")
    page.wait_for_url(f"{live_server.url}/nodes/ready-1/")

    drawn = page.locator('#node-charts .chart[data-drawn="true"]')
    page.locator('#node-charts .chart[data-key="load"][data-drawn="true"]').wait_for()
    assert drawn.count() == 3
    for i in range(drawn.count()):
        chart = drawn.nth(i)
        assert chart.locator(".event-marker:not([hidden])").count() == 1, chart.get_attribute("data-key")

    marker = page.locator('.chart[data-key="cpu"] .event-marker')
    tip = marker.locator(".event-tip")
    assert not tip.is_visible()
    marker.scroll_into_view_if_needed()
    marker.hover()
    assert tip.is_visible()
    # The reason is text in an isolating element, never markup.
    assert tip.locator("bdi").inner_text() == f"Admin: active → cordoned · “{reason}” — operator"
    assert tip.locator("img").count() == 0
    # The same event in the list under the charts, for the keyboard and screen readers: the page's one list.
    assert reason in page.locator("#node-charts .chart-events").inner_text()
    assert page.locator("main li", has_text=reason).count() == 1


def test_the_range_is_in_the_url_and_the_refresh_keeps_it(
    clocked, live_server, operator, cluster, settings, prometheus
):
    page = clocked
    settings.PROMETHEUS_URL = prometheus.url
    asked: list[str] = []
    page.on("request", lambda request: asked.append(request.url) if "/charts/" in request.url else None)
    log_in(page, live_server.url, "operator", "operator-pass", path="/nodes/ready-1/")
    page.locator('#node-charts[data-range="1h"] .chart[data-drawn="true"]').first.wait_for()

    page.click("#range-6h")
    page.wait_for_url(f"{live_server.url}/nodes/ready-1/?range=6h")
    assert page.locator("#range-6h").get_attribute("aria-current") == "page"
    page.locator('#node-charts[data-range="6h"] .chart[data-key="cpu"][data-drawn="true"]').wait_for()
    assert "No data in the last 6 h." in page.locator('.chart[data-key="queue"]').inner_text()

    # Scrolled to the end of a short window, the reader keeps their place through a refresh.
    page.set_viewport_size({"width": 1280, "height": 400})
    page.evaluate("window.scrollTo(0, document.body.scrollHeight)")
    scrolled = page.evaluate("window.scrollY")
    assert scrolled > 0
    refreshed = swapped(page, "#node-charts")
    page.clock.run_for(CHARTS_POLL_MS)
    refreshed()
    page.locator('#node-charts[data-range="6h"] .chart[data-key="cpu"][data-drawn="true"]').wait_for()
    assert page.evaluate("window.scrollY") == scrolled
    assert page.url == f"{live_server.url}/nodes/ready-1/?range=6h"
    assert [url.split("/charts/")[1] for url in asked] == ["?range=1h", "?range=6h", "?range=6h"]


def test_a_focused_node_link_keeps_focus_through_a_table_refresh(clocked, live_server, operator, cluster):
    page = clocked
    log_in(page, live_server.url, "operator", "operator-pass")
    # The first Tab reaches the skip link, which takes the keyboard to the table.
    page.keyboard.press("Tab")
    assert page.evaluate("document.activeElement.className") == "skip-link"
    page.keyboard.press("Enter")
    page.keyboard.press("Tab")
    assert page.evaluate("document.activeElement.closest('#node-table') !== null")

    page.focus("#node-ready-1 td:first-child a")
    refreshed = swapped(page, "#node-table")
    page.clock.run_for(TABLE_POLL_MS)
    refreshed()
    # The new table's link to the same node has the focus, not the page's body.
    assert page.evaluate("document.activeElement.closest('tr') && document.activeElement.closest('tr').id") == (
        "node-ready-1"
    )
    page.keyboard.press("Enter")
    page.wait_for_url(f"{live_server.url}/nodes/ready-1/")


def test_a_selection_in_the_table_holds_its_refresh_until_it_ends(clocked, live_server, operator, cluster):
    page = clocked
    log_in(page, live_server.url, "operator", "operator-pass")
    page.evaluate(
        """() => {
            const range = document.createRange();
            range.selectNodeContents(document.querySelector('#node-ready-1 td.hostname'));
            window.getSelection().addRange(range);
            window.__row = document.querySelector('#node-ready-1');
        }"""
    )
    selected = page.evaluate("window.getSelection().toString()")
    assert selected
    asked: list[str] = []
    page.on("request", lambda request: asked.append(request.url) if request.headers.get("hx-request") else None)
    page.clock.run_for(TABLE_POLL_MS * 2)
    # No request went out, so the row and the selection in it are the same ones.
    assert asked == []
    assert page.evaluate("window.__row.isConnected")
    assert page.evaluate("window.getSelection().toString()") == selected

    page.evaluate("window.getSelection().removeAllRanges()")
    page.clock.run_for(TABLE_POLL_MS)
    page.wait_for_function("() => !window.__row.isConnected")
