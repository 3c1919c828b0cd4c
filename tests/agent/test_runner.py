"""The runner with real processes: groups started, stopped, restarted and killed."""

import json
import os
import signal
import socket
import subprocess
import sys

import pytest

from agent import leftovers, protocol
from agent import runner as runner_module
from agent.runner import Runner
from devstack.polling import wait_until

FAMILY = "sleep 60 & sleep 60 & wait"
# A leader that ignores SIGTERM (and so does its child).
STUBBORN = "trap '' TERM; sleep 60 & wait; sleep 60"


def spec(shard: str, script: str, **extra) -> protocol.ShardSpec:
    return protocol.ShardSpec(
        shard=shard, replica="r", model="m", engine="command", command=["sh", "-c", script], **extra
    )


def group_members(pgid: int) -> list[int]:
    members = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat", "rb") as f:
                    fields = f.read().rpartition(b")")[2].split()
            except OSError:
                continue
            if int(fields[2]) == pgid and fields[0] != b"Z":
                members.append(int(name))
    return members


@pytest.fixture
def runner(tmp_path):
    runner = Runner(tmp_path / "logs", grace=0.5, backoff_base=0.05, backoff_cap=0.2)
    yield runner
    runner.stop_all(grace=0.5)


def polled(runner: Runner, condition) -> bool:
    runner.poll()
    return condition()


def status(runner: Runner, shard: str) -> protocol.ShardStatus:
    return {s.shard: s for s in runner.statuses()}[shard]


def test_each_shard_is_its_own_process_group(runner):
    runner.reconcile([spec("a", FAMILY), spec("b", FAMILY)])
    groups = runner.process_groups()
    assert set(groups) == {"a", "b"}
    for pgid in groups.values():
        assert os.getpgid(pgid) == pgid
        wait_until(lambda pgid=pgid: len(group_members(pgid)) == 3, 5, "the leader and its two children")
    runner.poll()
    assert {s.shard: s.state for s in runner.statuses()} == {"a": "running", "b": "running"}
    assert status(runner, "a").pid == groups["a"]


def test_a_shard_left_out_is_stopped_with_its_whole_group(runner):
    runner.reconcile([spec("a", FAMILY), spec("b", FAMILY)])
    pgid = runner.process_groups()["a"]
    wait_until(lambda: len(group_members(pgid)) == 3, 5, "the group to form")
    runner.reconcile([spec("b", FAMILY)])
    wait_until(
        lambda: polled(runner, lambda: "a" not in runner.process_groups() and not group_members(pgid)), 5, "a to stop"
    )
    assert [s.shard for s in runner.statuses()] == ["b"]


def test_an_exited_shard_is_restarted_with_backoff(runner):
    runner.reconcile([spec("a", "exit 3")])
    wait_until(lambda: polled(runner, lambda: status(runner, "a").state == "exited"), 5, "the exit to be noticed")
    assert status(runner, "a").exit_code == 3
    wait_until(lambda: polled(runner, lambda: status(runner, "a").restarts >= 3), 10, "three restarts")
    shard = runner.shards["a"]
    assert shard.backoff == pytest.approx(0.2)  # 0.05, 0.1, 0.2: doubled up to the cap


def test_restarting_then_running_after_an_exit(runner, tmp_path):
    flag = tmp_path / "crashed-once"
    runner.reconcile([spec("a", f"if [ -e {flag} ]; then exec sleep 60; fi; touch {flag}; exit 1")])
    wait_until(lambda: polled(runner, lambda: status(runner, "a").restarts == 1), 5, "one restart")
    wait_until(lambda: polled(runner, lambda: status(runner, "a").state == "running"), 5, "running again")
    assert status(runner, "a").exit_code == 1


def test_a_killed_shard_reports_the_signal(runner):
    runner.reconcile([spec("a", "sleep 60")])
    os.kill(runner.process_groups()["a"], signal.SIGKILL)
    wait_until(lambda: polled(runner, lambda: status(runner, "a").exit_code == -9), 5, "the kill to be noticed")
    assert "signal 9" in status(runner, "a").detail


def test_a_changed_spec_restarts_the_shard(runner, tmp_path):
    runner.reconcile([spec("a", "sleep 60")])
    old = runner.process_groups()["a"]
    runner.reconcile([spec("a", "sleep 61")])
    wait_until(lambda: polled(runner, lambda: runner.process_groups().get("a") not in (None, old)), 5, "a restart")
    assert runner.shards["a"].spec.command[-1] == "sleep 61"
    assert not group_members(old)
    assert status(runner, "a").restarts == 0


def test_an_unchanged_spec_is_left_alone(runner):
    runner.reconcile([spec("a", "sleep 60")])
    pid = runner.process_groups()["a"]
    runner.reconcile([spec("a", "sleep 60")])
    runner.poll()
    assert runner.process_groups()["a"] == pid


def test_a_group_that_ignores_sigterm_is_killed_after_the_grace_period(runner):
    runner.reconcile([spec("a", STUBBORN)])
    pgid = runner.process_groups()["a"]
    wait_until(lambda: len(group_members(pgid)) == 2, 5, "the group to form")
    runner.reconcile([])
    runner.poll()
    assert group_members(pgid), "still alive inside the grace period"
    wait_until(lambda: polled(runner, lambda: not group_members(pgid)), 5, "SIGKILL after the grace period")


def test_stop_all_leaves_nothing_behind(runner):
    runner.reconcile([spec("a", FAMILY), spec("b", STUBBORN)])
    groups = runner.process_groups()
    wait_until(lambda: all(group_members(g) for g in groups.values()), 5, "the groups to form")
    runner.stop_all(grace=0.3)
    # The leaders are waited for; a child killed with its group dies once the kernel schedules it,
    # a moment later on a busy machine.
    wait_until(lambda: not any(group_members(g) for g in groups.values()), 2, "every member of the groups to die")
    assert {s.state for s in runner.statuses()} == {"stopped"}


def test_a_command_that_cannot_start_is_failed_and_retried(runner, tmp_path):
    bad = protocol.ShardSpec(shard="a", replica="r", model="m", engine="vllm", command=[str(tmp_path / "no-vllm")])
    runner.reconcile([bad])
    assert status(runner, "a").state == "failed"
    assert "cannot start" in status(runner, "a").detail
    wait_until(lambda: polled(runner, lambda: runner.shards["a"].restarts >= 2), 5, "retries")


def test_environment_reaches_the_engine(tmp_path):
    runner = Runner(tmp_path / "logs", env={"FROM_CONFIG": "config", "BOTH": "config"})
    out = tmp_path / "env.txt"
    runner.reconcile([spec("a", f"env > {out}; exec sleep 60", env={"BOTH": "spec", "CUDA_VISIBLE_DEVICES": "2,3"})])
    wait_until(lambda: out.exists() and "CUDA" in out.read_text(), 5, "the environment dump")
    env = dict(line.split("=", 1) for line in out.read_text().splitlines() if "=" in line)
    assert (env["FROM_CONFIG"], env["BOTH"], env["CUDA_VISIBLE_DEVICES"]) == ("config", "spec", "2,3")
    runner.stop_all(grace=0.5)


def test_output_goes_to_the_shard_log(runner, tmp_path):
    runner.reconcile([spec("a", "echo hello from the engine; exec sleep 60")])
    log = tmp_path / "logs" / "a.log"
    wait_until(lambda: log.exists() and "hello from the engine" in log.read_text(), 5, "the log line")


def test_starting_until_the_port_answers(runner, tmp_path):
    from devstack.ports import free_port

    port = free_port()
    server = f"{sys.executable} -m http.server --bind 127.0.0.1 {port}"
    runner.reconcile([spec("a", f"sleep 0.5; exec {server}", port=port)])
    runner.poll()
    assert status(runner, "a").state == "starting"
    assert status(runner, "a").metrics_port == port
    wait_until(lambda: polled(runner, lambda: status(runner, "a").state == "running"), 10, "the port to answer")


HEALTH_AFTER_FILE = """
import http.server, os, sys
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        loaded = os.path.exists(sys.argv[2])
        self.send_response(200 if self.path == "/health" and loaded else 503)
        self.end_headers()
    def log_message(self, *a):
        pass
http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
"""


def port_open(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=0.1).close()
        return True
    except OSError:
        return False


def test_a_known_engine_is_starting_until_its_health_endpoint_says_ok(runner, tmp_path):
    from devstack.ports import free_port

    port, loaded = free_port(), tmp_path / "loaded"
    (tmp_path / "engine.py").write_text(HEALTH_AFTER_FILE)
    command = [sys.executable, str(tmp_path / "engine.py"), str(port), str(loaded)]
    runner.reconcile(
        [protocol.ShardSpec(shard="a", replica="r", model="m", engine="llama.cpp", command=command, port=port)]
    )
    # The port answers (503: the model is loading) and the shard is still starting.
    wait_until(lambda: port_open(port), 10, "the port to open")
    runner.poll()
    assert status(runner, "a").state == "starting"
    loaded.touch()
    wait_until(lambda: polled(runner, lambda: status(runner, "a").state == "running"), 10, "the health check")


def test_an_exited_engine_reports_its_last_lines(runner):
    runner.reconcile([spec("a", "echo loading; echo 'error: model file is corrupt' >&2; exit 3")])
    wait_until(lambda: polled(runner, lambda: status(runner, "a").exit_code == 3), 10, "the exit")
    assert status(runner, "a").detail.startswith("exited with code 3\nloading\nerror: model file is corrupt")


def test_the_detail_keeps_the_end_of_a_long_log(tmp_path):
    log = tmp_path / "a.log"
    log.write_text("".join(f"line {i}\n" for i in range(10_000)))
    detail = runner_module.with_tail("exited with code 1", log)
    assert len(detail) <= protocol.MAX_DETAIL
    assert detail.startswith("exited with code 1\nline ") and detail.endswith("\nline 9999")


def test_groups_left_by_a_killed_agent_are_stopped_by_the_next(tmp_path):
    record = tmp_path / "groups.json"
    crashed = Runner(tmp_path / "logs", record_file=record)
    crashed.reconcile([spec("a", FAMILY)])
    pgid = crashed.process_groups()["a"]
    wait_until(lambda: len(group_members(pgid)) == 3, 5, "the group to form")
    # The agent dies without stopping anything; the next one starts.
    assert leftovers.reap(record, grace=2) == ["a"]
    assert not group_members(pgid)
    crashed.poll()  # reap our own child, as the dead agent never could


def test_a_recorded_pid_now_used_by_another_process_is_left_alone(tmp_path):
    other = subprocess.Popen(["sleep", "60"], start_new_session=True)
    try:
        record = tmp_path / "groups.json"
        leftovers.record(record, {"a": (other.pid, leftovers.start_time(other.pid) + 1)})
        assert leftovers.reap(record, grace=1) == []
        assert other.poll() is None
        assert not record.exists()
    finally:
        other.kill()
        other.wait()


def test_the_record_follows_the_live_groups(tmp_path):
    record = tmp_path / "groups.json"
    runner = Runner(tmp_path / "logs", record_file=record, grace=0.5)
    runner.reconcile([spec("a", "sleep 60"), spec("b", "sleep 60")])
    assert set(json.loads(record.read_text())) == {"a", "b"}
    runner.reconcile([spec("b", "sleep 60")])
    wait_until(lambda: polled(runner, lambda: set(json.loads(record.read_text())) == {"b"}), 5, "a to leave the record")
    runner.stop_all()
    assert json.loads(record.read_text()) == {}


def test_a_large_log_is_rotated_at_start(runner, tmp_path, monkeypatch):
    monkeypatch.setattr(runner_module, "MAX_LOG_BYTES", 100)
    log = tmp_path / "logs" / "a.log"
    log.parent.mkdir()
    log.write_bytes(b"x" * 200)
    runner.reconcile([spec("a", "echo fresh; exec sleep 60")])
    wait_until(lambda: log.read_bytes() == b"fresh\n", 5, "a fresh log")
    assert (tmp_path / "logs" / "a.log.1").read_bytes() == b"x" * 200


def test_nothing_starts_after_stop_all(runner):
    runner.reconcile([spec("a", "sleep 60")])
    runner.stop_all(grace=0.5)
    runner.reconcile([spec("a", "sleep 61"), spec("b", "sleep 60")])
    runner.poll()
    assert runner.process_groups() == {}


def test_a_log_tail_with_nul_bytes_makes_a_detail_the_control_plane_accepts(tmp_path):
    # The control plane refuses any string holding NUL (PostgreSQL cannot store one): an engine
    # that logged one must not make every heartbeat of its node a 400.
    log = tmp_path / "shard.log"
    log.write_bytes(b"loading\x00weights\nboom\x00\n")

    detail = runner_module.with_tail("exited with 1", log)

    assert "\x00" not in detail
    assert detail.endswith("loadingweights\nboom")
