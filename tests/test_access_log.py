"""The access log of a real gunicorn: pages and refusals are logged, agents' accepted calls are not."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import requests

from devstack.polling import wait_until
from devstack.ports import free_port, port_open
from llmgw_site.gunicorn_logging import worth_logging

ROOT = Path(__file__).resolve().parent.parent
GUNICORN = Path(sys.executable).parent / "gunicorn"


def test_only_the_agent_apis_successful_posts_are_left_out():
    assert not worth_logging("POST", "/api/v1/heartbeat", 200)
    assert not worth_logging("POST", "/api/v1/register", 200)
    assert worth_logging("POST", "/api/v1/heartbeat", 401)
    assert worth_logging("POST", "/api/v1/heartbeat", 503)
    assert worth_logging("GET", "/api/v1/prometheus/targets", 200)
    assert worth_logging("GET", "/", 302)
    assert worth_logging("POST", "/nodes/n1/admin-state/", 200)


@pytest.mark.slow
def test_a_real_gunicorn_logs_with_it(tmp_path, redis_server):
    url = redis_server if isinstance(redis_server, str) else redis_server.url
    port = free_port()
    log = tmp_path / "access.log"
    env = {
        "PATH": "/usr/bin:/bin",
        "LLMGW_VAR_DIR": str(tmp_path),
        "REDIS_URL": url,
        "LLMGW_BENCH_EMPTY_VIEW": "true",
    }
    command = [str(GUNICORN), "llmgw_site.wsgi", "--bind", f"127.0.0.1:{port}", "--workers", "1"]
    command += ["--access-logfile", str(log), "--logger-class", "llmgw_site.gunicorn_logging.AccessLog"]
    server = subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_until(lambda: port_open(port), 30, "gunicorn listening")
        base = f"http://127.0.0.1:{port}"
        assert requests.post(f"{base}/api/v1/bench-empty", data=b"{}", timeout=10).status_code == 200
        assert requests.post(f"{base}/api/v1/heartbeat", data=b"{}", timeout=10).status_code == 415
        assert requests.get(f"{base}/healthz", timeout=10).status_code == 200
        wait_until(lambda: "/healthz" in log.read_text(), 10, "the access line of /healthz")
        lines = log.read_text().splitlines()
        assert any("/api/v1/heartbeat" in line and " 415 " in line for line in lines)
        assert not any("/api/v1/bench-empty" in line for line in lines)
    finally:
        server.terminate()
        server.wait(10)
