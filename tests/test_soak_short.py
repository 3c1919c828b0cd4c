"""The soak, short: 2 minutes, 200 simulated nodes and 2 real agents, every fault once.

It runs `python -m bench.soak` as `make soak` does, with a private PostgreSQL (so that
restarting it disturbs nothing else on the machine) and thresholds scaled down
to fit two minutes. Each check of the report is asserted on its own, so a
failure names what went wrong.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    out = tmp_path_factory.mktemp("soak")
    command = [
        sys.executable,
        "-m", "bench.soak",
        "--minutes", "2",
        "--nodes", "200",
        "--agents", "2",
        "--private-postgres",
        "--interval", "2",
        "--beat-period", "2",
        "--unreachable-after", "6",
        "--lost-after", "20",
        "--redis-outage", "15",
        "--workers", "2",
        "--out", str(out),
        "--bench-results", "",
    ]  # fmt: skip
    result = subprocess.run(command, capture_output=True, text=True, timeout=540, cwd=ROOT)
    path = out / "latest.json"
    assert path.exists(), f"no report (exit {result.returncode}):\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    return json.loads(path.read_text())


pytestmark = pytest.mark.slow


def test_every_fault_was_injected(report):
    timeline = [entry["event"] for entry in report["timeline"]]
    events = " ".join(timeline)
    for what in ("Redis stopped", "web killed", "PostgreSQL restarted", "Celery worker and beat killed"):
        assert any(e.startswith(what) and e.endswith(": over") for e in timeline), what
    assert "nodes back after passing unreachable" in events
    assert "nodes back after passing lost" in events
    assert "nodes silenced until the end" in events
    assert events.count("operator acted") >= 3


@pytest.mark.parametrize(
    "check", ["inventory", "states", "transitions", "allocations", "metrics", "operator", "clock_skew"]
)
def test_check_passed(report, check):
    result = report["checks"][check]
    assert result["ok"], json.dumps(result, indent=1)


def test_heartbeats_outside_outages_almost_never_fail(report):
    beats = report["checks"]["heartbeats"]
    assert beats["heartbeats_outside_outages"] > 200 * 30  # most of two minutes at one beat per 2 s
    assert beats["error_rate_outside_outages"] < 0.001, beats


def test_replicas_on_lost_nodes_were_rebuilt(report):
    allocations = report["checks"]["allocations"]
    assert allocations["replicas_wanted"] > 0
    assert allocations["replicas_on_nodes_that_were_lost"] > 0
    # Released from the lost nodes, and the deployments back to their full count elsewhere.
    assert allocations["of_those_still_live"] == []
    assert allocations["live_shards_on_lost_nodes"] == 0
    assert allocations["replicas_placed_at_end"] == allocations["replicas_wanted"]


def test_metrics_were_sampled_and_had_loads(report):
    metrics = report["checks"]["metrics"]
    assert metrics["scrapes"] >= 5
    assert metrics["most_nodes_with_a_load"] >= 150


def test_every_process_was_measured_at_start_and_end(report):
    processes = report["checks"]["memory"]["processes"]
    for name in ("redis", "web", "celery", "agent-0", "postgres"):
        assert processes[name]["start_mib"] and processes[name]["end_mib"], name


def test_grace_periods_excused_few_silences(report):
    # The control plane's grace periods may let a node off a state (a loaded machine
    # begins them), but a run they excused wholesale would have tested nothing.
    transitions = report["checks"]["transitions"]
    assert transitions["excused_by_grace_periods"] <= 5, (transitions, report["grace_periods"])
    assert transitions["silenced_nodes"] >= 15, transitions
