"""End to end, as `make run` starts it: the demo deployment reaches running on a real agent,
and Prometheus finds its engines through the control plane."""

from __future__ import annotations

import json
import re
import sqlite3
import urllib.request

import pytest
import requests

from devstack.polling import wait_until
from devstack.ports import free_port
from devstack.stack import Stack

pytestmark = pytest.mark.slow


def get_json(url: str):
    with urllib.request.urlopen(url, timeout=5) as response:
        return json.load(response)


def test_the_demo_deployment_runs_and_prometheus_scrapes_its_engines(tmp_path, redis_server):
    redis_url = redis_server if isinstance(redis_server, str) else redis_server.url
    database = tmp_path / "llmgw.sqlite3"
    stack = Stack(
        tmp_path,
        env={
            "DATABASE_URL": f"sqlite:///{database}",
            "REDIS_URL": redis_url,
            "LLMGW_BEAT_PERIOD": "1",
            "LLMGW_HEARTBEAT_INTERVAL": "1",
        },
        web_port=free_port(),
        prometheus_port=free_port(),
        workers=2,
    )
    base = f"http://127.0.0.1:{stack.web_port}"

    def replica_states() -> list[str]:
        with sqlite3.connect(f"file:{database}?mode=ro", uri=True) as db:
            return [state for (state,) in db.execute("SELECT state FROM inventory_replica ORDER BY ordinal")]

    try:
        stack.manage("migrate", "--noinput", "-v0")
        stack.manage("ensure_admin", "--password-stdin", stdin="demo-pass-e2e\n", capture=True)
        stack.start_web()
        stack.start(stack.celery_part())
        stack.start(stack.prometheus_part())
        # The stand-in engine alone: the real model on llama.cpp has its own test (tests/browser/test_demo_model.py).
        stack.manage("setup_demo", "--var-dir", str(tmp_path), "--control-plane", base, "--no-real-model", capture=True)
        stack.start(stack.agent_part())

        wait_until(lambda: replica_states() == ["running", "running"], 90, "both demo replicas running")
        groups = get_json(f"{base}/api/v1/prometheus/targets")
        assert len(groups) == 2
        for group in groups:
            assert group["labels"]["engine"] == "demo"
            # A real engine answers there.
            with urllib.request.urlopen(f"http://{group['targets'][0]}/metrics", timeout=5) as response:
                assert b"vllm:num_requests_waiting" in response.read()

        def shard_figures_exported() -> bool:
            with urllib.request.urlopen(f"{base}/metrics", timeout=5) as response:
                text = response.read().decode()
            lines = [line for line in text.splitlines() if line.startswith("llmgw_shard_memory_bytes{")]
            return len(lines) == 2 and all('model="demo"' in line and 'shard="demo-r' in line for line in lines)

        # The agent measures each engine's process group; /metrics labels it with its replica and model.
        wait_until(shard_figures_exported, 60, "both demo shards' memory in /metrics")

        # The node page lists both engines with the cores and memory the agent measured.
        with sqlite3.connect(f"file:{database}?mode=ro", uri=True) as db:
            (node_id,) = {row[0] for row in db.execute("SELECT node_id FROM inventory_shard")}
        browser = requests.Session()
        browser.get(f"{base}/admin/login/", timeout=5)
        browser.post(
            f"{base}/admin/login/",
            data={"username": "admin", "password": "demo-pass-e2e", "next": "/"},
            headers={"X-CSRFToken": browser.cookies["csrftoken"], "Referer": f"{base}/admin/login/"},
            timeout=5,
        )
        page = browser.get(f"{base}/nodes/{node_id}/", timeout=5)
        assert page.status_code == 200
        rows = re.findall(r"<tr[^>]*>\s*<td><code>(demo-r\d+-s0)</code></td>(.*?)</tr>", page.text, re.S)
        assert len(rows) == 2, page.text
        for _, cells in rows:
            numbers = re.findall(r'<td class="numeric">([^<]*)</td>', cells)
            cores, resident = numbers[0], numbers[1]
            assert cores != "—" and resident != "—", cells

        def engines_up() -> bool:
            active = get_json(f"http://127.0.0.1:{stack.prometheus_port}/api/v1/targets")["data"]["activeTargets"]
            engines = [t for t in active if t["labels"].get("job") == "llmgw-engines"]
            return len(engines) == 2 and all(t["health"] == "up" for t in engines)

        wait_until(engines_up, 90, "Prometheus scraping both demo engines")
    finally:
        stack.stop_all()
