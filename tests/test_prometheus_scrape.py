"""A real Prometheus scrapes a running control plane and answers with the fleet's values."""

from __future__ import annotations

import json
import shutil
import subprocess
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

from agent import protocol
from devstack.polling import wait_until
from devstack.ports import free_port
from livestate import loadstore
from tests.factories import place

PROMETHEUS = shutil.which("prometheus")
RULES = Path(__file__).resolve().parent.parent / "deploy" / "rules" / "llmgw.rules.yml"
TOKEN = "scrape-token-for-tests"

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(PROMETHEUS is None, reason="prometheus missing: apt-get install prometheus"),
]


class Prometheus:
    """A prometheus of the test's own: free port, temporary storage, one-second scrapes."""

    def __init__(self, workdir: Path, target: str):
        self.port = free_port()
        (workdir / "token").write_text(TOKEN)
        shutil.copy(RULES, workdir / "llmgw.rules.yml")
        config = workdir / "prometheus.yml"
        config.write_text(
            json.dumps(
                {
                    "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
                    "rule_files": ["llmgw.rules.yml"],
                    "scrape_configs": [
                        {
                            "job_name": "llmgw",
                            "authorization": {"credentials_file": str(workdir / "token")},
                            "static_configs": [{"targets": [target]}],
                        }
                    ],
                }
            )
        )
        self.process = subprocess.Popen(
            [
                str(PROMETHEUS),
                f"--config.file={config}",
                f"--storage.tsdb.path={workdir / 'data'}",
                f"--web.listen-address=127.0.0.1:{self.port}",
            ],
            stdout=subprocess.DEVNULL,
            stderr=(workdir / "prometheus.log").open("wb"),
        )

    def get(self, path: str, **params: str) -> dict:
        url = f"http://127.0.0.1:{self.port}{path}"
        if params:
            url += "?" + urllib.parse.urlencode(params)
        with urllib.request.urlopen(url, timeout=5) as response:
            return json.load(response)

    def ready(self) -> bool:
        if self.process.poll() is not None:
            raise RuntimeError(f"prometheus exited with {self.process.returncode}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/-/ready", timeout=1) as response:
                return response.status == 200
        except OSError:
            return False

    def query(self, expr: str) -> dict[frozenset, float]:
        result = self.get("/api/v1/query", query=expr)["data"]["result"]
        return {frozenset(r["metric"].items()): float(r["value"][1]) for r in result}

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(15)


@pytest.fixture
def prometheus(tmp_path, live_server, settings):
    settings.LLMGW_METRICS_TOKEN = TOKEN
    server = Prometheus(tmp_path, live_server.url.removeprefix("http://"))
    try:
        wait_until(server.ready, 30, "prometheus to be ready")
        yield server
    finally:
        server.stop()


def test_prometheus_scrapes_the_fleet_and_reads_the_values_back(cluster, redis_client, prometheus):
    place("llama", {"ready-1": [0, 1, 2, 3]}, memory_gb=80, model="meta-llama/Llama-3.1-8B")
    load = protocol.Load(
        cpu_percent=42.5,
        cpus=96,
        load1=3.5,
        memory_used_bytes=100 * 2**30,
        memory_available_bytes=412 * 2**30,
        shards=[protocol.ShardLoad(shard="llama-r1-s0", cpu_cores=3.25, rss_bytes=9 * 2**30)],
    )
    loadstore.save("ready-1", load, time.time())
    # A load measured before the limit is not exported, though Redis still holds it.
    loadstore.save("cordoned-1", load, time.time() - 120)

    wait_until(lambda: prometheus.query('up{job="llmgw"} == 1'), 60, "a successful scrape of /metrics")
    wait_until(lambda: prometheus.query("llmgw_node_cpu_utilization_percent"), 30, "the load in Prometheus")

    job = {"job": "llmgw", "instance": dict(next(iter(prometheus.query("up"))))["instance"]}
    assert prometheus.query("llmgw_node_cpu_utilization_percent") == {
        frozenset({**job, "__name__": "llmgw_node_cpu_utilization_percent", "node": "ready-1"}.items()): 42.5
    }
    shard = prometheus.query("llmgw_shard_memory_bytes")
    assert shard == {
        frozenset(
            {
                **job,
                "__name__": "llmgw_shard_memory_bytes",
                "node": "ready-1",
                "shard": "llama-r1-s0",
                "replica": "llama-r1",
                "model": "meta-llama/Llama-3.1-8B",
                "served_model": "llama",
            }.items()
        ): 9 * 2**30
    }
    assert prometheus.query('llmgw_node_gpus_free{node="ready-1"}').popitem()[1] == 4
    states = prometheus.query("llmgw_node_state")
    assert sorted(dict(labels)["state"] for labels in states) == ["cordoned", "lost", "ready", "unreachable"]

    # The rules run on the scraped series: the lost node alerts at once.
    def lost_alert() -> list:
        alerts = prometheus.get("/api/v1/alerts")["data"]["alerts"]
        return [a for a in alerts if a["labels"]["alertname"] == "LLMGWNodeLost" and a["state"] == "firing"]

    wait_until(lost_alert, 30, "the LLMGWNodeLost alert")
    assert [a["labels"]["node"] for a in lost_alert()] == ["lost-1"]


def test_promtool_finds_nothing_to_say_about_a_scrape_over_http(cluster, redis_client, live_server, settings):
    settings.LLMGW_METRICS_TOKEN = TOKEN
    place("s", {"ready-1": [0]}, model="m")
    loadstore.save(
        "ready-1", protocol.Load(cpu_percent=1, cpus=2, shards=[protocol.ShardLoad(shard="s-r1-s0")]), time.time()
    )
    request = urllib.request.Request(
        f"{live_server.url}/metrics",
        headers={"Authorization": f"Bearer {TOKEN}", "Accept": "text/plain; version=0.0.4"},
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        text = response.read()
    assert b"llmgw_shard_cpu_cores{" in text
    result = subprocess.run([shutil.which("promtool"), "check", "metrics"], input=text, capture_output=True, timeout=60)
    assert (result.returncode, result.stdout + result.stderr) == (0, b"")
