"""End to end: a real Celery beat renders /metrics ahead, and granian answers Prometheus' scrape from the render."""

from __future__ import annotations

import pytest
import requests

import livestate
from agent import protocol
from devstack.polling import wait_until
from devstack.ports import free_port
from devstack.stack import Stack
from livestate import keys
from tests.agentapi import JOIN_TOKEN, a_load, register_over_http
from tests.factories import make_inventory
from tests.test_metrics_prerender import PROMETHEUS

pytestmark = [pytest.mark.slow]


@pytest.fixture
def stack(tmp_path, _redis_everywhere):
    stack = Stack(
        tmp_path,
        env={
            "DATABASE_URL": f"sqlite:///{tmp_path / 'e2e.sqlite3'}",
            "REDIS_URL": _redis_everywhere,
            "LLMGW_JOIN_TOKEN": JOIN_TOKEN,
        },
        web_port=free_port(),
        workers=1,
    )
    stack.manage("migrate", "--noinput", "-v0")
    try:
        stack.start_web()
        stack.start(stack.celery_part())
        yield stack
    finally:
        stack.stop_all()


def test_the_beat_renders_and_a_prometheus_scrape_is_answered_from_the_render(stack):
    base = f"http://127.0.0.1:{stack.web_port}"
    register = protocol.Register(node_id="gpu-1", inventory=make_inventory("gpu-1.example"), inventory_hash="h")
    token = register_over_http(base, register)
    beat = requests.post(
        f"{base}/api/v1/heartbeat",
        data=protocol.encode(protocol.Heartbeat(inventory_hash="h", load=a_load(12.5))),
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
        timeout=10,
    )
    assert beat.status_code == 200
    client = livestate.client()
    client.delete(keys.METRICS_FLEET)
    # The beat renders every LLMGW_METRICS_RENDER_PERIOD (10 s).
    wait_until(lambda: client.exists(keys.METRICS_FLEET), 30, "Celery beat's render of /metrics")
    response = requests.get(f"{base}/metrics", headers=PROMETHEUS, timeout=10)
    assert response.status_code == 200
    assert response.headers["Content-Encoding"] == "gzip"
    # A render is answered whole (with its length); a scrape rendered on request is streamed.
    assert "Content-Length" in response.headers
    text = response.text  # requests reads every gzip member
    assert 'llmgw_node_cpu_utilization_percent{node="gpu-1"} 12.5\n' in text
    assert "llmgw_heartbeats_accepted_total 1.0\n" in text
    assert text.endswith("# EOF\n")
