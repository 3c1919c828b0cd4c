"""The gateway's own series: HAProxy's exporter on its own address, scraped by a real Prometheus with the job
and rules we ship (deploy/prometheus.yml's llmgw-gateway, deploy/rules/gateway.rules.yml), in front of real
demo engines; and the engines' time-to-first-token histogram the p50/p99 come from.
"""

from __future__ import annotations

import shutil

import pytest
import requests
import yaml
from django.core.management import CommandError, call_command

from devstack.polling import wait_until
from inventory.models import Deployment, ReplicaState, Shard
from tests.prometheus import PrometheusServer
from tests.test_gateway import CHAT, ROOT, Engine, Gateway, serve

pytestmark = pytest.mark.slow


@pytest.fixture
def running(db, gateway, key):
    """One replica of `chat` served by a demo engine, programmed into the gateway with the key."""
    replica = serve("gw-1", 0)
    engine = Engine(Deployment.objects.get(pk=replica.deployment_id).engine_secret, cpu_ms_per_token=2)
    Shard.objects.filter(replica=replica).update(port=engine.port)
    gateway.sync.run_once()
    yield replica, engine
    engine.stop()


def exported(gateway: Gateway) -> dict[str, float]:
    """The gateway exporter's samples, by their series as written (name and labels)."""
    text = requests.get(f"http://127.0.0.1:{gateway.metrics_port}/metrics", timeout=5).text
    return {
        line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line and not line.startswith("#")
    }


def server_series(name: str, replica: str, **labels: str) -> str:
    extra = "".join(f',{k}="{v}"' for k, v in labels.items())
    return f'{name}{{proxy="m_chat",server="{replica}"{extra}}}'


@pytest.mark.django_db
def test_the_gateway_exports_requests_errors_and_requests_in_flight_per_replica(gateway, running, key):
    replica, _ = running
    for _ in range(3):
        assert gateway.post("/v1/chat/completions", CHAT, key).status_code == 200
    stream = gateway.post(
        "/v1/completions", {"model": "chat", "prompt": "x", "max_tokens": 4096, "stream": True}, key, stream=True
    )
    # The lines' iterator is kept: dropped, it closes the response, and the client is gone.
    lines = stream.iter_lines()
    assert next(line for line in lines if line).startswith(b"data: ")
    series = exported(gateway)
    responses = "haproxy_server_http_responses_total"
    # A response is counted when its headers go out: the open stream is one of them.
    assert series[server_series(responses, replica.replica_id, code="2xx")] == 4
    assert series[server_series("haproxy_server_current_sessions", replica.replica_id)] == 1
    assert series['haproxy_backend_active_servers{proxy="m_chat"}'] == 1
    stream.close()
    wait_until(
        lambda: exported(gateway)[server_series("haproxy_server_current_sessions", replica.replica_id)] == 0,
        10,
        "the stream to leave the replica",
    )

    # No ready replica: HAProxy's own 503 counts against the model (the backend), not a replica.
    Shard.objects.filter(replica=replica).update(state=ReplicaState.FAILED)
    gateway.sync.run_once()
    assert gateway.post("/v1/chat/completions", CHAT, key).status_code == 503
    series = exported(gateway)
    assert series['haproxy_backend_active_servers{proxy="m_chat"}'] == 0
    assert series['haproxy_backend_http_responses_total{proxy="m_chat",code="5xx"}'] == 1
    assert series['haproxy_backend_http_requests_total{proxy="m_chat"}'] == 5


@pytest.mark.django_db
def test_the_exporter_is_only_on_its_own_address(gateway, running, key):
    # The clients' port does not serve it, with or without a key; the metrics address serves nothing else.
    assert gateway.post("/metrics", b"", key).status_code == 404
    assert requests.get(gateway.url("/metrics"), timeout=5).status_code == 401
    assert requests.get(f"http://127.0.0.1:{gateway.metrics_port}/v1/models", timeout=5).status_code == 404


@pytest.mark.django_db
def test_the_demo_engine_counts_each_requests_time_to_first_token(gateway, running, key):
    _, engine = running
    for _ in range(2):
        assert gateway.post("/v1/chat/completions", CHAT, key).status_code == 200
    assert engine.gauge("vllm:time_to_first_token_seconds_count") == 2
    assert 0 < engine.gauge("vllm:time_to_first_token_seconds_sum") < 10


class GatewayPrometheus(PrometheusServer):
    """Prometheus with the shipped llmgw-gateway job (its relabelling) and gateway rules, on a test's gateway."""

    def config_text(self) -> str:
        shipped = yaml.safe_load((ROOT / "deploy" / "prometheus.yml").read_text())
        job = next(j for j in shipped["scrape_configs"] if j["job_name"] == "llmgw-gateway")
        job = {**job, "scrape_interval": self.interval, "static_configs": [{"targets": [self.target]}]}
        config = {
            "global": {"scrape_interval": self.interval, "evaluation_interval": self.interval},
            "rule_files": [str(self.rules)],
            "scrape_configs": [job],
        }
        return yaml.safe_dump(config)

    def query(self, expr: str) -> dict[frozenset, float]:
        answer = requests.get(f"{self.url}/api/v1/query", params={"query": expr}, timeout=5).json()
        results = answer["data"]["result"]
        # By labels, the series' name left out.
        return {
            frozenset((k, v) for k, v in s["metric"].items() if k != "__name__"): float(s["value"][1]) for s in results
        }


@pytest.mark.skipif(shutil.which("prometheus") is None, reason="prometheus missing: apt-get install prometheus")
@pytest.mark.django_db
def test_prometheus_records_the_gateways_series_per_served_model_and_replica(tmp_path, gateway, running, key):
    replica, _ = running
    prometheus = GatewayPrometheus(
        tmp_path / "prometheus",
        f"127.0.0.1:{gateway.metrics_port}",
        rules=ROOT / "deploy" / "rules" / "gateway.rules.yml",
    ).start()
    try:
        # Prometheus takes a few seconds to start scraping a new target: the stream starts after.
        wait_until(lambda: prometheus.query('up{job="llmgw-gateway"} == 1'), 30, "a scrape of the gateway")
        stream = gateway.post(
            "/v1/completions", {"model": "chat", "prompt": "x", "max_tokens": 4096, "stream": True}, key, stream=True
        )
        lines = stream.iter_lines()
        assert next(line for line in lines if line).startswith(b"data: ")
        labels = frozenset({"served_model": "chat", "replica": replica.replica_id}.items())
        wait_until(
            lambda: prometheus.query("llmgw:gateway_replica_requests_in_flight").get(labels) == 1,
            30,
            "the stream in flight on the replica, recorded",
        )
        stream.close()
        assert prometheus.query("llmgw:gateway_model_ready_replicas") == {
            frozenset({"served_model": "chat"}.items()): 1
        }
        # HAProxy's own proxies (the clients' frontend, the exporter's) carry no served_model.
        assert prometheus.query('count(haproxy_frontend_http_requests_total{served_model=""})')
        # Only the families the job keeps are stored: 15 or so series per server, not the exporter's 63.
        assert prometheus.query("haproxy_server_current_queue")
        assert not prometheus.query("haproxy_server_max_queue") and not prometheus.query("haproxy_server_status")
    finally:
        prometheus.stop()


@pytest.mark.parametrize("bind", ["8091", "127.0.0.1", "127.0.0.1:0", "127.0.0.1:99999", "a b:1"])
def test_a_bad_metrics_address_is_refused_by_name(tmp_path, bind):
    with pytest.raises(CommandError, match="--metrics-bind must be ADDRESS:PORT"):
        call_command(
            "gateway_sync", "--dir", str(tmp_path), "--bind", "127.0.0.1:8090", "--metrics-bind", bind, "--render-only"
        )
    assert not (tmp_path / "gateway.cfg").exists()


def test_the_metrics_address_becomes_a_frontend_of_its_own(tmp_path, db):
    call_command(
        "gateway_sync",
        "--dir",
        str(tmp_path),
        "--bind",
        "127.0.0.1:8090",
        "--metrics-bind",
        "127.0.0.1:8091",
        "--render-only",
    )
    config = (tmp_path / "gateway.cfg").read_text()
    section = config[config.index("frontend metrics") :].split("\n\n")[0]
    assert "    bind 127.0.0.1:8091\n" in section
    assert "use-service prometheus-exporter if { path /metrics }" in section
    # Without it, no exporter at all.
    call_command("gateway_sync", "--dir", str(tmp_path), "--bind", "127.0.0.1:8090", "--render-only")
    assert "prometheus-exporter" not in (tmp_path / "gateway.cfg").read_text()
