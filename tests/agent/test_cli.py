"""`python -m agent` as a real process: --once --print, --once, SIGTERM, start-up errors."""

import json
import signal
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from devstack.polling import wait_until
from tests.agent.test_runner import group_members

ROOT = Path(__file__).resolve().parents[2]


def write_config(tmp_path: Path, url: str, extra: str = "") -> Path:
    (tmp_path / "join-token").write_text("join-secret")
    path = tmp_path / "agent.yaml"
    path.write_text(
        f"control_plane: {url}\njoin_token_file: {tmp_path / 'join-token'}\nstate_dir: {tmp_path / 'state'}\n"
        f"interval: 0.2\nengines: {{}}\nlabels: {{role: test}}\n{extra}"
    )
    return path


def agent(*args: str, **kwargs) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "agent", *args],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        **kwargs,
    )


def test_once_print_prints_the_heartbeat_and_contacts_no_one(tmp_path):
    # Port 9 on loopback: nothing listens, and --print must not try.
    config = write_config(tmp_path, "http://127.0.0.1:9")
    out, _ = agent("--config", str(config), "--once", "--print").communicate(timeout=60)
    heartbeat = json.loads(out)
    assert heartbeat["inventory"]["labels"] == {"role": "test"}
    assert heartbeat["inventory_hash"]
    assert 0 <= heartbeat["load"]["cpu_percent"] <= 100
    assert heartbeat["load"]["interval_seconds"] == pytest.approx(0.2, abs=0.05)
    assert not (tmp_path / "state" / "node-token").exists()


def test_once_sends_one_heartbeat(tmp_path, plane):
    config = write_config(tmp_path, plane.url)
    process = agent("--config", str(config), "--once")
    out, err = process.communicate(timeout=60)
    assert process.returncode == 0, err
    assert json.loads(out)["state"] == "ready"
    assert plane.accepted() == 1 and len(plane.registrations) == 1


def test_once_reports_a_failure_with_exit_1(tmp_path):
    config = write_config(tmp_path, "http://127.0.0.1:9")
    process = agent("--config", str(config), "--once")
    _, err = process.communicate(timeout=60)
    assert process.returncode == 1
    assert "heartbeat failed" in err


def test_sigterm_stops_every_engine_group_and_exits_0(tmp_path, plane):
    shard = "  - {shard: s%d, engine: command, command: [sh, -c, 'sleep 60 & sleep 60 & wait']}\n"
    config = write_config(tmp_path, plane.url, "shards:\n" + shard % 1 + shard % 2)
    process = agent("--config", str(config))
    wait_until(lambda: plane.accepted() >= 1 and len(plane.heartbeats[-1].shards) == 2, 30, "both shards reported")
    pgids = [s.pid for s in plane.heartbeats[-1].shards]
    wait_until(lambda: all(len(group_members(pgid)) == 3 for pgid in pgids), 10, "each leader and its two children")
    process.send_signal(signal.SIGTERM)
    _, err = process.communicate(timeout=30)
    assert process.returncode == 0, err
    assert not any(group_members(pgid) for pgid in pgids)


def test_a_missing_adapter_stops_the_agent_at_start(tmp_path):
    config = write_config(tmp_path, "http://127.0.0.1:9", "fabrics: [{name: ib, hcas: [mlx5_nonexistent]}]\n")
    process = agent("--config", str(config), "--once", "--print")
    _, err = process.communicate(timeout=60)
    assert process.returncode == 2
    assert err.strip().count("\n") == 0 and "mlx5_nonexistent" in err


def test_print_without_once_is_a_usage_error(tmp_path):
    process = agent("--config", str(write_config(tmp_path, "http://127.0.0.1:9")), "--print")
    process.communicate(timeout=30)
    assert process.returncode == 2


def test_the_unit_runs_the_documented_command():
    unit = (ROOT / "deploy" / "llmgw-agent.service").read_text()
    # The wheel's console script (pyproject.toml) is `python -m agent` under another name.
    assert "/bin/llmgw-agent --config /etc/llmgw/agent.yaml" in unit
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["scripts"]["llmgw-agent"] == "agent.__main__:main"
    assert "RestartPreventExitStatus=2" in unit  # a bad config is not retried every few seconds


def test_the_unit_runs_the_agent_as_its_own_user_with_its_cgroup_delegated():
    unit = (ROOT / "deploy" / "llmgw-agent.service").read_text()
    service = unit.split("[Service]", 1)[1].split("\n[", 1)[0]
    settings = dict(line.split("=", 1) for line in service.splitlines() if "=" in line and not line.startswith("#"))
    # Not root: whatever a reply made it run would own the machine.
    assert settings.get("User") == "llmgw-agent" and settings.get("Group") == "llmgw-agent"
    assert settings.get("NoNewPrivileges") == "yes"
    # Engines still get cgroups of their own, below the unit's.
    assert settings.get("Delegate") == "yes"
    assert "## Running as its own user" in (ROOT / "docs" / "agent.md").read_text()


def test_a_state_dir_that_cannot_be_made_exits_2(tmp_path):
    config = write_config(tmp_path, "http://127.0.0.1:9")
    config.write_text(config.read_text().replace(str(tmp_path / "state"), "/proc/no/state"))
    process = agent("--config", str(config))
    _, err = process.communicate(timeout=60)
    assert process.returncode == 2
    assert err.strip().splitlines() == [
        f"agent: {config}: state_dir: cannot create /proc/no/state: No such file or directory"
    ]
