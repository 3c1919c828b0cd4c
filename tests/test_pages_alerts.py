"""Alerts firing, from a real Prometheus evaluating our own rules, on the node and cluster pages."""

from __future__ import annotations

import json
import re
import socket
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from threading import Thread

import pytest
import requests

from devstack.polling import wait_until
from devstack.ports import free_port
from nodes import promalerts
from tests.prometheus import ExpositionServer, PrometheusServer

RULES = Path(__file__).resolve().parent.parent / "deploy" / "rules" / "llmgw.rules.yml"
HTMX = {"HTTP_HX_REQUEST": "true"}


@pytest.fixture(autouse=True)
def _fresh_alerts():
    """Each test asks its own Prometheus; an answer kept from another test would be wrong here."""
    promalerts.cache.clear()
    yield
    promalerts.cache.clear()


@pytest.fixture
def viewer_client(client, viewer):
    client.force_login(viewer)
    return client


@pytest.fixture(scope="module")
def firing_prometheus(tmp_path_factory):
    """Prometheus with deploy/rules/ scraping a control plane that says lost-1 is lost:
    LLMGWNodeLost has no `for:`, so it fires at the first evaluation."""
    exposition = ExpositionServer(
        'llmgw_node_state{node="lost-1",state="lost"} 1\n'
        'llmgw_node_state{node="ready-1",state="lost"} 0\n'
        'llmgw_node_state{node="ready-1",state="ready"} 1\n'
    ).start()
    server = PrometheusServer(tmp_path_factory.mktemp("prometheus"), f"127.0.0.1:{exposition.port}", rules=RULES)
    server.start()

    def lost_fires() -> bool:
        alerts = requests.get(f"{server.url}/api/v1/alerts", timeout=2).json()["data"]["alerts"]
        return any(a["labels"]["alertname"] == "LLMGWNodeLost" and a["state"] == "firing" for a in alerts)

    wait_until(lost_fires, 30, "LLMGWNodeLost to fire")
    yield server
    server.stop()
    exposition.stop()


def test_node_page_shows_what_fires_with_summary_and_since(viewer_client, cluster, settings, firing_prometheus):
    settings.PROMETHEUS_URL = firing_prometheus.url
    html = viewer_client.get("/nodes/lost-1/").content.decode()
    alerts = html[
        html.index('<section class="alerts"') : html.index("</section>", html.index('<section class="alerts"'))
    ]
    assert "LLMGWNodeLost" in alerts
    assert "critical" in alerts
    assert "Node lost-1 is lost" in alerts
    assert re.search(r'since <time datetime="\d{4}-\d\d-\d\dT', alerts)
    # The live partial carries them too, so they come and go without a reload.
    assert "LLMGWNodeLost" in viewer_client.get("/nodes/lost-1/", **HTMX).content.decode()


def test_a_node_with_nothing_firing_says_so(viewer_client, cluster, settings, firing_prometheus):
    settings.PROMETHEUS_URL = firing_prometheus.url
    html = viewer_client.get("/nodes/ready-1/").content.decode()
    assert "No alert firing." in html
    assert "LLMGWNodeLost" not in html


def alert_cell(html: str, node_id: str) -> str:
    row = html[html.index(f'<tr id="node-{node_id}"') :]
    row = row[: row.index("</tr>")]
    return re.search(r'<td class="numeric alerts">(.*?)</td>', row).group(1)


def test_cluster_page_counts_alerts_per_node_and_in_the_summary(viewer_client, cluster, settings, firing_prometheus):
    settings.PROMETHEUS_URL = firing_prometheus.url
    html = viewer_client.get("/").content.decode()
    assert alert_cell(html, "lost-1") == '<span class="alert-count">1</span>'
    assert alert_cell(html, "ready-1") == '<span class="muted">0</span>'
    assert re.search(
        r'<span class="num" data-count="alerts">1</span> firing <span class="muted">on 1 node</span>', html
    )
    # The refresh carries the counts in the table and, out of band, in the summary.
    partial = viewer_client.get("/", **HTMX).content.decode()
    assert alert_cell(partial, "lost-1") == '<span class="alert-count">1</span>'
    assert 'data-count="alerts">1<' in partial


def test_prometheus_down_is_never_no_alerts(viewer_client, cluster, settings):
    settings.PROMETHEUS_URL = f"http://127.0.0.1:{free_port()}"
    node = viewer_client.get("/nodes/lost-1/").content.decode()
    assert f"Alerts unavailable: Prometheus at {settings.PROMETHEUS_URL} is not reachable." in node
    assert "No alert firing" not in node
    page = viewer_client.get("/").content.decode()
    assert f"Alerts unavailable: Prometheus at {settings.PROMETHEUS_URL} is not reachable." in page
    assert 'data-count="alerts"' not in page
    assert alert_cell(page, "lost-1") == '<span class="muted" title="alerts unavailable">?</span>'


class _Answering:
    """An HTTP server answering /api/v1/alerts with a fixed body, counting the requests."""

    def __init__(self, body: object):
        self.requests = 0
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):
                # Only the alerts calls count: the cluster page also asks for requests waiting (nodes/promengines.py).
                owner.requests += self.path.startswith("/api/v1/alerts")
                raw = json.dumps(body).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(raw)))
                self.end_headers()
                self.wfile.write(raw)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        Thread(target=self.server.serve_forever, daemon=True).start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.mark.parametrize(
    ("body", "why"),
    [
        ({"status": "success", "data": {"alerts": None}}, "data.alerts is null, not a list"),
        ({"status": "success", "data": {"alerts": [{"state": "firing", "labels": []}]}}, "labels is a list"),
        ({"status": "success", "data": {"alerts": [{"state": 1, "labels": {}}]}}, "state is a number"),
    ],
)
def test_an_answer_of_the_wrong_shape_is_said(viewer_client, cluster, settings, body, why):
    server = _Answering(body)
    try:
        settings.PROMETHEUS_URL = server.url
        html = viewer_client.get("/nodes/lost-1/").content.decode()
        assert "Alerts unavailable: Prometheus at" in html
        assert why in html
    finally:
        server.stop()


def test_one_call_per_render_and_kept_briefly(viewer_client, cluster, settings):
    firing = {
        "labels": {"alertname": "LLMGWNodeLost", "node": "lost-1", "severity": "critical"},
        "annotations": {"summary": "<b>lost</b>"},
        "state": "firing",
        "activeAt": "2026-12-01T10:00:00.123456789Z",
    }
    pending = {**firing, "labels": {**firing["labels"], "alertname": "Pending"}, "state": "pending"}
    server = _Answering({"status": "success", "data": {"alerts": [firing, pending]}})
    try:
        settings.PROMETHEUS_URL = server.url
        page = viewer_client.get("/").content.decode()
        assert server.requests == 1
        viewer_client.get("/", **HTMX)
        node = viewer_client.get("/nodes/lost-1/").content.decode()
        assert server.requests == 1
        assert 'data-count="alerts">1<' in page
        # Pending has not waited its `for:` yet; the summary is the rule's text, escaped.
        assert "Pending" not in node
        assert "&lt;b&gt;lost&lt;/b&gt;" in node
        assert '<time datetime="2026-12-01T10:00:00.123456+00:00">' in node
    finally:
        server.stop()


def test_a_hanging_prometheus_costs_one_short_wait_per_max_age(settings):
    """Accepts connections and never answers. The failure is kept like an answer, so the
    cluster table's refreshes do not each wait for it."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    try:
        settings.PROMETHEUS_URL = f"http://127.0.0.1:{listener.getsockname()[1]}"
        started = time.monotonic()
        first = promalerts.firing()
        waited = time.monotonic() - started
        assert first.problem == f"Prometheus at {settings.PROMETHEUS_URL} did not answer within 1 s"
        assert promalerts.TIMEOUT <= waited < promalerts.TIMEOUT + 1
        started = time.monotonic()
        assert promalerts.firing() is first
        assert time.monotonic() - started < 0.1
    finally:
        listener.close()
