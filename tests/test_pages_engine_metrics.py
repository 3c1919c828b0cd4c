"""Engine metrics on the pages, from a real Prometheus evaluating the generated engine rules over a test exporter:
the node page's per-model running-requests and tokens/s charts, "no engine metrics" with the reason on a running
shard without series (never a 0), and the cluster table's requests waiting per node."""

from __future__ import annotations

import json
import re
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from threading import Thread
from urllib.parse import parse_qs

import pytest
import requests

from agent import protocol
from devstack.polling import wait_until
from devstack.ports import free_port
from inventory.desired import orders
from inventory.models import Deployment, Engine
from nodes import promengines, promgateway
from tests.factories import place
from tests.prometheus import ExpositionServer, PrometheusServer

RULES = Path(__file__).resolve().parent.parent / "deploy" / "rules" / "engines.rules.yml"
HTMX = {"HTTP_HX_REQUEST": "true"}
# SGLang's gauges, labelled as the control plane's service discovery labels an engine target: the recorded
# series then carry exactly these values, with no rate window to wait for.
TALKING = {"node": "ready-1", "shard": "chat-r1-s0", "replica": "chat-r1", "model": "org/chat", "engine": "sglang"}


def _labels(values: dict[str, str]) -> str:
    return ",".join(f'{k}="{v}"' for k, v in values.items())


EXPORTED = (
    f"sglang:num_queue_reqs{{{_labels(TALKING)}}} 3\n"
    f"sglang:num_running_reqs{{{_labels(TALKING)}}} 2\n"
    f"sglang:gen_throughput{{{_labels(TALKING)}}} 41.5\n"
)


@pytest.fixture(autouse=True)
def _fresh_answers():
    """Each test asks its own Prometheus; an answer kept from another test would be wrong here."""
    promengines.cache.clear()
    yield
    promengines.cache.clear()


@pytest.fixture
def viewer_client(client, viewer):
    client.force_login(viewer)
    return client


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory):
    exposition = ExpositionServer(EXPORTED).start()
    server = PrometheusServer(tmp_path_factory.mktemp("prometheus"), f"127.0.0.1:{exposition.port}", rules=RULES)
    server.start()
    for signal in ("queue_depth", "requests_running", "tokens_per_second"):
        wait_until(lambda s=signal: server.samples(f"llmgw:shard_{s}") >= 2, 30, f"llmgw:shard_{signal} recorded")
    yield server
    server.stop()
    exposition.stop()


def running(name: str, node_id: str = "ready-1", engine: str = str(Engine.SGLANG)) -> str:
    """A shard of deployment `name` on `node_id` that its agent reports running; returns its id."""
    replica = place(name, {node_id: [0 if name == "chat" else 1]}, model=f"org/{name}")
    Deployment.objects.filter(pk=replica.deployment.pk).update(engine=engine)
    shard = f"{replica.replica_id}-s0"
    orders(node_id, [protocol.ShardStatus(shard=shard, state="running", metrics_port=9100)])
    return shard


def shard_row(html: str, shard: str) -> str:
    return re.search(rf"<tr>\s*<td><code>{shard}</code>.*?</tr>", html, re.S).group(0)


def chart_data(html: str) -> dict:
    return json.loads(re.search(r'<script id="chart-data" type="application/json">(.*?)</script>', html).group(1))


def test_running_requests_and_tokens_per_second_are_charted_per_model(viewer_client, cluster, settings, prometheus):
    settings.PROMETHEUS_URL = prometheus.url
    html = viewer_client.get("/nodes/ready-1/charts/", **HTMX).content.decode()
    charts = {chart["key"]: chart for chart in chart_data(html)["charts"]}
    for key, value in (("running", 2.0), ("tokens", 41.5), ("queue", 3.0)):
        assert charts[key]["series"] == ["org/chat"], key
        # The newest point is what the engine exported, through the recording rule.
        assert charts[key]["values"][0][-1] == value, key
    assert charts["running"]["title"] == "Running requests per model"
    assert charts["tokens"]["title"] == "Tokens/s per model"


def test_a_running_shard_without_series_says_no_engine_metrics_and_why(viewer_client, cluster, settings, prometheus):
    settings.PROMETHEUS_URL = prometheus.url
    talking, silent = running("chat"), running("quiet")
    html = viewer_client.get("/nodes/ready-1/", **HTMX).content.decode()
    row = shard_row(html, silent)
    assert "no engine metrics" in row
    assert "Prometheus has no series for this shard in the last 1h" in row
    assert "no engine metrics" not in shard_row(html, talking)


def test_an_engine_the_table_does_not_know_is_named_as_the_reason(viewer_client, cluster, settings, prometheus):
    settings.PROMETHEUS_URL = prometheus.url
    shard = running("script", engine=Engine.COMMAND)
    row = shard_row(viewer_client.get("/nodes/ready-1/", **HTMX).content.decode(), shard)
    assert "no engine metrics" in row
    assert "llmgw knows no metrics of the command engine" in row


def test_a_shard_whose_series_stopped_says_since_when(cluster, settings, prometheus):
    # Prometheus holds the shard's samples, but the newest is older than the alert's five minutes.
    seen = promengines.Answer(values={"chat-r1-s0": 1_800_000_000.0})
    reason = promengines.missing_reason("chat-r1-s0", Engine.SGLANG, seen, now=1_800_000_000.0 + 600)
    assert reason == "Prometheus has no series for this shard since 2027-01-15 08:00:00 UTC"
    assert promengines.missing_reason("chat-r1-s0", Engine.SGLANG, seen, now=1_800_000_000.0 + 60) is None


def test_the_last_sample_time_comes_from_prometheus(settings, prometheus):
    settings.PROMETHEUS_URL = prometheus.url
    seen = promengines.last_seen("ready-1")
    newest = requests.get(f"{prometheus.url}/api/v1/query", params={"query": "time()"}).json()["data"]["result"]
    assert seen.problem is None
    assert set(seen.values) == {"chat-r1-s0"}
    assert float(newest[0]) - 70 < seen.values["chat-r1-s0"] <= float(newest[0])


def test_without_prometheus_the_shard_says_so_and_not_zero(viewer_client, cluster, settings):
    settings.PROMETHEUS_URL = f"http://127.0.0.1:{free_port()}"
    shard = running("chat")
    row = shard_row(viewer_client.get("/nodes/ready-1/", **HTMX).content.decode(), shard)
    assert "no engine metrics" in row
    assert f"Prometheus unavailable: Prometheus at {settings.PROMETHEUS_URL} is not reachable" in row


def test_the_cluster_table_shows_requests_waiting_per_node(viewer_client, cluster, settings, prometheus):
    settings.PROMETHEUS_URL = prometheus.url
    html = viewer_client.get("/", **HTMX).content.decode()
    assert re.search(r'<th class="c-waiting numeric">waiting</th>', html)
    ready = re.search(r'<tr id="node-ready-1".*?</tr>', html, re.S).group(0)
    assert '<td class="numeric waiting">3</td>' in ready
    # A node with no engine metrics has a blank cell: nothing waits there that anyone knows of, not 0.
    cordoned = re.search(r'<tr id="node-cordoned-1".*?</tr>', html, re.S).group(0)
    assert '<td class="numeric waiting"></td>' in cordoned


def test_the_cluster_table_says_question_mark_when_prometheus_cannot(viewer_client, cluster, settings):
    settings.PROMETHEUS_URL = f"http://127.0.0.1:{free_port()}"
    html = viewer_client.get("/", **HTMX).content.decode()
    ready = re.search(r'<tr id="node-ready-1".*?</tr>', html, re.S).group(0)
    assert re.search(
        r'<td class="numeric waiting"><span class="muted" title="requests waiting unknown: [^"]+">\?</span>', ready
    )


class _CountingPrometheus:
    """Answers every instant query with node ready-1's 7 requests waiting, and records the queries asked."""

    def __init__(self) -> None:
        self.queries: list[str] = []
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):
                path, _, query = self.path.partition("?")
                if path == "/api/v1/query":
                    owner.queries.append(parse_qs(query)["query"][0])
                body = {"status": "success", "data": {"resultType": "vector", "result": []}}
                if path == "/api/v1/query":
                    body["data"]["result"] = [{"metric": {"node": "ready-1"}, "value": [1.0, "7"]}]
                if path == "/api/v1/alerts":
                    body = {"status": "success", "data": {"alerts": []}}
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


def test_requests_waiting_is_one_fleet_wide_query_kept_briefly(viewer_client, cluster, settings):
    server = _CountingPrometheus()
    try:
        settings.PROMETHEUS_URL = server.url
        page = viewer_client.get("/").content.decode()
        viewer_client.get("/", **HTMX)
        viewer_client.get("/?page=2", **HTMX)
        assert server.queries == [promengines.WAITING_QUERY]
        assert '<td class="numeric waiting">7</td>' in re.search(r'<tr id="node-ready-1".*?</tr>', page, re.S).group(0)
    finally:
        server.stop()


def test_a_node_page_without_running_shards_asks_prometheus_nothing_about_engines(viewer_client, cluster, settings):
    server = _CountingPrometheus()
    try:
        settings.PROMETHEUS_URL = server.url
        viewer_client.get("/nodes/ready-1/", **HTMX)
        assert server.queries == []
        running("chat")
        viewer_client.get("/nodes/ready-1/", **HTMX)
        viewer_client.get("/nodes/ready-1/", **HTMX)
        # The shard's engine series, and requests in flight at the gateways; each kept for a few seconds.
        assert server.queries == [promengines.last_seen_query("ready-1"), promgateway.IN_FLIGHT_QUERY]
    finally:
        server.stop()
