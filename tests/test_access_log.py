"""The access log of the real web server: pages and refusals are logged, agents' accepted calls are not."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import requests

from devstack.polling import wait_until
from devstack.ports import free_port, port_open
from devstack.stack import web_server_command
from lib.access_log import worth_logging

ROOT = Path(__file__).resolve().parent.parent


def test_only_the_agent_apis_successful_posts_are_left_out():
    assert not worth_logging("POST", "/api/v1/heartbeat", 200)
    assert not worth_logging("POST", "/api/v1/register", 200)
    assert worth_logging("POST", "/api/v1/heartbeat", 401)
    assert worth_logging("POST", "/api/v1/heartbeat", 503)
    assert worth_logging("GET", "/api/v1/prometheus/targets", 200)
    assert worth_logging("GET", "/", 302)
    assert worth_logging("POST", "/nodes/n1/admin-state/", 200)


@pytest.mark.slow
def test_the_web_server_as_the_stack_runs_it_logs_with_it(tmp_path, redis_server):
    url = redis_server if isinstance(redis_server, str) else redis_server.url
    port = free_port()
    log = tmp_path / "access.log"
    env = {
        "PATH": "/usr/bin:/bin",
        "LLMGW_VAR_DIR": str(tmp_path),
        "REDIS_URL": url,
        "LLMGW_BENCH_EMPTY_VIEW": "true",
    }
    with log.open("wb") as output:
        server = subprocess.Popen(
            web_server_command(port, 1), cwd=ROOT, env=env, stdout=output, stderr=subprocess.STDOUT
        )
    try:
        wait_until(lambda: port_open(port), 30, "the web server listening")
        base = f"http://127.0.0.1:{port}"
        assert requests.post(f"{base}/api/v1/bench-empty", data=b"{}", timeout=10).status_code == 200
        assert requests.post(f"{base}/api/v1/heartbeat", data=b"{}", timeout=10).status_code == 415
        assert requests.get(f"{base}/healthz", timeout=10).status_code == 200
        wait_until(lambda: "/healthz" in log.read_text(), 10, "the access line of /healthz")
        lines = [line for line in log.read_text().splitlines() if "llmgw.access" in line]
        assert any('"POST /api/v1/heartbeat" 415 ' in line for line in lines), lines
        assert any('"GET /healthz" 200 ' in line for line in lines), lines
        assert not any("/api/v1/bench-empty" in line for line in lines)
    finally:
        server.terminate()
        server.wait(10)
