"""Two web instances behind HAProxy, one killed under a simulated fleet's load (bench/scaleout.py, small).

It runs `python -m bench.scaleout` as `make bench` does, with 200 nodes beating
every 2 s for 30 s and a private PostgreSQL, and asserts each of its checks on
its own so that a failure names what went wrong.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
WORKERS = 2

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    out = tmp_path_factory.mktemp("scaleout")
    command = [
        sys.executable,
        "-m", "bench.scaleout",
        "--nodes", "200",
        "--interval", "2",
        "--seconds", "30",
        "--unreachable-after", "10",
        "--beat-period", "1",
        "--workers", str(WORKERS),
        "--private-postgres",
        "--out", str(out),
    ]  # fmt: skip
    result = subprocess.run(command, capture_output=True, text=True, timeout=300, cwd=ROOT)
    path = out / "scaleout.json"
    assert path.exists(), f"no report (exit {result.returncode}):\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    return json.loads(path.read_text())


def test_no_heartbeat_is_lost_beyond_the_agents_retry(report):
    figures = report["figures"]
    assert figures["heartbeats"] >= 200 / 2 * 30 * 0.9, figures
    assert figures["lost_after_retry"] == 0, figures


def test_only_what_the_killed_instance_held_fails_a_first_try(report):
    # The requests it was serving or had queued when it died (502); every later one that
    # HAProxy sent there was refused a connection and resent to the live instance, where
    # a 503 would show it was not. HAProxy lets each instance hold one request per worker,
    # and one more may be on its way in.
    figures = report["figures"]
    assert set(figures["first_try_statuses"]) <= {"502"}, figures
    assert figures["failed_first_try"] <= 2 * WORKERS, figures
    assert report["checks"]["first-try failures only requests in flight at the kill"], figures


def test_no_node_changed_liveness(report):
    figures = report["figures"]
    assert figures["liveness_changes"] == 0
    assert figures["nodes_alive_at_end"] == 200


def test_both_instances_served_and_the_killed_one_came_back(report):
    figures = report["figures"]
    assert figures["served_by_killed_instance_before_kill"] > 0
    assert all(served > 0 for served in figures["served_by_instance"].values()), figures
    events = [entry["event"] for entry in report["timeline"]]
    assert "HAProxy marked web-1 down" in events
    assert "web-1 started again and UP" in events


def test_every_check_of_the_run_passed(report):
    assert report["ok"], json.dumps(report["checks"], indent=1)
