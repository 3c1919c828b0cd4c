"""promtool on what we ship: the config, the rules and their unit tests, and a real scrape."""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path

import pytest

from tests import factories
from tests.metrics_scrape import TEXT, body

DEPLOY = Path(__file__).resolve().parent.parent / "deploy"
PROMTOOL = shutil.which("promtool")

pytestmark = pytest.mark.skipif(PROMTOOL is None, reason="promtool missing: apt-get install prometheus")


def promtool(*args: str, stdin: bytes | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([str(PROMTOOL), *args], input=stdin, capture_output=True, cwd=DEPLOY, timeout=120)


def test_the_prometheus_config_is_valid():
    result = promtool("check", "config", "prometheus.yml")
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_rules_are_valid():
    result = promtool("check", "rules", "rules/llmgw.rules.yml", "rules/gateway.rules.yml")
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_rules_pass_their_unit_tests():
    tests = sorted(str(path.relative_to(DEPLOY)) for path in (DEPLOY / "rules" / "tests").glob("*.yml"))
    assert tests
    result = promtool("test", "rules", *tests)
    assert result.returncode == 0, (result.stdout + result.stderr).decode()


def test_every_alert_has_a_unit_test():
    rules = (DEPLOY / "rules" / "llmgw.rules.yml").read_text()
    alerts = {line.split(":", 1)[1].strip() for line in rules.splitlines() if line.strip().startswith("- alert:")}
    tested = "".join(path.read_text() for path in (DEPLOY / "rules" / "tests").glob("*.yml"))
    assert len(alerts) == 9
    assert {alert for alert in alerts if f"alertname: {alert}" not in tested} == set()


def test_every_gateway_alert_has_a_unit_test():
    rules = (DEPLOY / "rules" / "gateway.rules.yml").read_text()
    alerts = {line.split(":", 1)[1].strip() for line in rules.splitlines() if line.strip().startswith("- alert:")}
    tested = (DEPLOY / "rules" / "tests" / "gateway.yml").read_text()
    assert alerts == {"LLMGWModelNoReadyReplica", "LLMGWModelErrorRatioHigh", "LLMGWModelTimeToFirstTokenHigh"}
    assert {alert for alert in alerts if f"alertname: {alert}" not in tested} == set()


def test_a_scrape_of_a_populated_control_plane_passes_promtool_check_metrics(client, cluster, redis_client):
    from livestate import selfmetrics

    ids = factories.build(20, at=time.time())
    factories.save_loads(ids, time.time())
    selfmetrics.record(selfmetrics.heartbeat_fields("accepted", 0.004))
    selfmetrics.record(selfmetrics.heartbeat_fields("invalid", 0.001))
    selfmetrics.record(selfmetrics.sweep_fields(1, 0, 0))
    text = body(client.get("/metrics", headers={"Accept": TEXT}))
    assert "llmgw_shard_cpu_cores{" in text and "llmgw_heartbeats_rejected_total{" in text
    result = promtool("check", "metrics", stdin=text.encode())
    assert (result.returncode, result.stdout + result.stderr) == (0, b"")
