"""The model page and the node page's requests in flight, from a real Prometheus evaluating the shipped rules
(gateway.rules.yml, engines.rules.yml) over a test exporter standing in for HAProxy's exporter (labelled as the
llmgw-gateway job's relabelling labels it) and an engine (labelled as service discovery labels it)."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest

from agent import protocol
from devstack.polling import wait_until
from devstack.ports import free_port
from inventory.desired import orders
from inventory.models import Deployment
from nodes import promengines
from tests.factories import place
from tests.prometheus import ExpositionServer, PrometheusServer

RULES = Path(__file__).resolve().parent.parent / "deploy" / "rules" / "*.rules.yml"
HTMX = {"HTTP_HX_REQUEST": "true"}
GATEWAY = 'served_model="chat",replica="chat-r1",proxy="m_chat",server="chat-r1"'
ENGINE = 'node="ready-1",shard="chat-r1-s0",replica="chat-r1",model="org/chat",engine="vllm",served_model="chat"'
# The gateway's sync labels its time-to-first-token histogram as the engines' targets are labelled.
SYNC = 'served_model="chat",replica="chat-r1"'


class GrowingExposition(ExpositionServer):
    """HAProxy's and an engine's series for replica chat-r1 of `chat`: counters growing 10 a second, gauges fixed."""

    def __init__(self):
        super().__init__()
        self.started = time.monotonic()

    @property
    def text(self) -> str:
        n = round(10 * (time.monotonic() - self.started), 3)
        return (
            f'haproxy_server_http_responses_total{{{GATEWAY},code="2xx"}} {n}\n'
            f'haproxy_server_http_responses_total{{{GATEWAY},code="5xx"}} 0\n'
            f"haproxy_server_current_sessions{{{GATEWAY}}} 3\n"
            f'haproxy_backend_http_responses_total{{served_model="chat",proxy="m_chat",code="5xx"}} 0\n'
            f"sglang:gen_throughput{{{ENGINE}}} 41.5\n"
            # Every stream's first token within 0.1 s at the gateway: p50 0.05 s and p99 0.099 s, by the
            # histogram's interpolation.
            f'llmgw_gateway_time_to_first_token_seconds_bucket{{{SYNC},le="0.1"}} {n}\n'
            f'llmgw_gateway_time_to_first_token_seconds_bucket{{{SYNC},le="+Inf"}} {n}\n'
        )

    @text.setter
    def text(self, value: str) -> None:
        pass


@pytest.fixture(autouse=True)
def _fresh_answers():
    promengines.cache.clear()
    yield
    promengines.cache.clear()


@pytest.fixture
def viewer_client(client, viewer):
    client.force_login(viewer)
    return client


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory):
    exposition = GrowingExposition().start()
    server = PrometheusServer(tmp_path_factory.mktemp("prometheus"), f"127.0.0.1:{exposition.port}", rules=RULES)
    server.start()
    for recorded in ("llmgw:gateway_replica_requests_per_second", "llmgw:model_ttft_seconds:p99"):
        # The first samples of a rate come once two scrapes are in; a few more make the newest point settled.
        wait_until(lambda r=recorded: server.samples(r) >= 3, 60, f"{recorded} recorded")
    yield server
    server.stop()
    exposition.stop()


@pytest.fixture
def chat(cluster):
    """Replica chat-r1 of the deployment served as `chat`, running on ready-1."""
    replica = place("chat", {"ready-1": [0]}, model="org/<b>chat</b>")
    orders("ready-1", [protocol.ShardStatus(shard="chat-r1-s0", state="running", metrics_port=9100)])
    assert Deployment.objects.get(pk=replica.deployment_id).served_model_name == "chat"
    return replica


def chart_data(html: str) -> dict:
    return json.loads(re.search(r'<script id="chart-data" type="application/json">(.*?)</script>', html).group(1))


def test_the_model_page_charts_requests_ttft_tokens_and_in_flight_by_replica(viewer_client, chat, settings, prometheus):
    settings.PROMETHEUS_URL = prometheus.url
    html = viewer_client.get("/models/chat/charts/?range=1h", **HTMX).content.decode()
    charts = {chart["key"]: chart for chart in chart_data(html)["charts"]}
    assert charts["in_flight"]["series"] == ["chat-r1"]
    assert charts["in_flight"]["values"][0][-1] == 3
    assert charts["tokens"]["series"] == ["chat-r1"]
    assert charts["tokens"]["values"][0][-1] == 41.5
    assert charts["requests"]["series"] == ["chat-r1"]
    # Seconds of a 1-minute rate window are in yet: a rate, not its settled value (promtool checks the numbers).
    assert charts["requests"]["values"][0][-1] > 0
    # The model's own line (HAProxy's 503s too) beside each replica's.
    assert charts["errors"]["series"] == ["chat-r1", "model total"]
    assert [column[-1] for column in charts["errors"]["values"]] == [0, 0]
    ttft = dict(zip(charts["ttft"]["series"], (column[-1] for column in charts["ttft"]["values"]), strict=True))
    assert ttft == {"p50": pytest.approx(0.05), "p99": pytest.approx(0.099)}
    assert charts["ttft"]["unit"] == "seconds"
    assert charts["ttft_replica"]["series"] == ["chat-r1"]
    assert charts["ttft_replica"]["values"][0][-1] == pytest.approx(0.099)


def test_the_model_page_lists_its_replicas_with_requests_in_flight(viewer_client, chat, settings, prometheus):
    settings.PROMETHEUS_URL = prometheus.url
    html = viewer_client.get("/models/chat/").content.decode()
    assert "<h1><bdi>chat</bdi>" in html
    assert "org/&lt;b&gt;chat&lt;/b&gt;" in html and "<b>chat</b>" not in html
    row = re.search(r'<tr id="replica-chat-r1">.*?</tr>', html, re.S).group(0)
    assert 'href="/nodes/ready-1/"' in row
    assert re.search(r'<td class="numeric in-flight">3</td>', row)
    # The live part refreshes alone.
    live = viewer_client.get("/models/chat/", **HTMX).content.decode()
    assert live.lstrip().startswith('<section id="model-live"') and "in-flight" in live and "<html" not in live


def test_the_node_page_shows_requests_in_flight_on_each_replicas_shard_row(viewer_client, chat, settings, prometheus):
    settings.PROMETHEUS_URL = prometheus.url
    html = viewer_client.get("/nodes/ready-1/", **HTMX).content.decode()
    row = re.search(r"<tr>\s*<td><code>chat-r1-s0</code>.*?</tr>", html, re.S).group(0)
    assert re.search(r'<td class="numeric in-flight">3</td>', row)
    assert 'href="/models/chat/"' in row


def test_without_prometheus_the_pages_say_why_and_still_list_the_replicas(viewer_client, chat, settings):
    settings.PROMETHEUS_URL = f"http://127.0.0.1:{free_port()}"
    html = viewer_client.get("/models/chat/").content.decode()
    assert 'id="replica-chat-r1"' in html
    assert "Requests in flight unavailable: Prometheus at http://127.0.0.1:" in html
    assert re.search(r'<td class="numeric in-flight">—</td>', html)
    charts = viewer_client.get("/models/chat/charts/", **HTMX).content.decode()
    assert "History is unavailable: Prometheus at http://127.0.0.1:" in charts
    node = viewer_client.get("/nodes/ready-1/", **HTMX).content.decode()
    assert re.search(r'<td class="numeric in-flight" title="unavailable: Prometheus at [^"]*">—</td>', node)


def test_an_unknown_model_is_404_and_its_refresh_stops_polling(viewer_client, chat):
    assert viewer_client.get("/models/nope/").status_code == 404
    assert viewer_client.get("/models/nope/charts/").status_code == 404
    assert viewer_client.get("/models/nope/", **HTMX).status_code == 286
    assert viewer_client.get("/models/nope/charts/", **HTMX).status_code == 286


def test_a_range_the_page_does_not_offer_is_refused_by_name(viewer_client, chat):
    answer = viewer_client.get("/models/chat/charts/?range=1y", **HTMX)
    assert answer.status_code == 400
    assert answer.content.decode().startswith("range: must be one of")


def test_the_model_page_needs_a_login(client, chat):
    for path in ("/models/chat/", "/models/chat/charts/"):
        answer = client.get(path)
        assert answer.status_code == 302 and "/login" in answer["Location"], path


def test_the_cluster_page_links_each_served_model_to_its_page(viewer_client, chat):
    html = viewer_client.get("/").content.decode()
    section = re.search(r'<section id="models".*?</section>', html, re.S).group(0)
    assert '<a id="model-chat" href="/models/chat/"><bdi>chat</bdi></a>' in section
