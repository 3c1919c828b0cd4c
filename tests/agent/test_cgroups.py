"""Engines measured through cgroups of their own: fixture trees laid out like cgroupfs, and a real one."""

import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import psutil
import pytest

from agent import cgroups, protocol
from agent.load import Sampler
from agent.procfs import Roots
from agent.runner import Runner
from devstack.polling import wait_until
from tests.agent import bigproc

SECONDS = 5.0


@pytest.fixture
def host(tmp_path):
    return bigproc.build(tmp_path / "proc", 200, cpus=16, engines=[(3, 0)])


@pytest.fixture
def root(tmp_path):
    return bigproc.cgroup_root(tmp_path / "cgroup" / "llmgw-agent.service")


def sampler_for(host) -> Sampler:
    return Sampler(host.root, clock_ticks=bigproc.CLOCK_TICKS, page_size=bigproc.PAGE)


def test_cores_and_memory_come_from_the_cgroups_counters(host, root):
    engine = host.engines[0]
    fake = bigproc.FakeCgroup(root / "engine-a", usage_usec=5_000_000, memory=3 * 2**30, pids=engine.pids).write()
    placement = cgroups.Cgroups(root).place("a")
    sampler = sampler_for(host)
    assert sampler.sample({"a": engine.leader}, {"a": placement}) is None

    host.advance(SECONDS, ticks_per_process=1)
    fake.usage_usec += 3_250_000
    fake.memory = 7 * 2**30
    fake.write()
    load = sampler.sample({"a": engine.leader}, {"a": placement})

    assert load.shards[0].cpu_cores == pytest.approx(3_250_000 / 1e6 / SECONDS)
    assert load.shards[0].rss_bytes == 7 * 2**30
    assert sampler.walker.members == {}, "an engine in its cgroup is not walked"
    assert sampler.own_pids == set(engine.pids)


def test_an_engine_placed_during_the_interval_counts_its_time_since_placement(host, root):
    engine = host.engines[0]
    fake = bigproc.FakeCgroup(root / "engine-a", usage_usec=9_000_000, memory=2**30, pids=engine.pids).write()
    sampler = sampler_for(host)
    sampler.sample({})
    # An earlier engine left 9 s in the reused cgroup; this one has used 0.8 s since it went in.
    placement = cgroups.Cgroups(root).place("a")
    host.advance(SECONDS, ticks_per_process=1)
    fake.usage_usec += 800_000
    fake.write()

    load = sampler.sample({"a": engine.leader}, {"a": placement})

    assert load.shards[0].cpu_cores == pytest.approx(0.8 / SECONDS)


def test_a_restarted_engine_is_not_charged_with_the_old_ones_time(host, root):
    engine = host.engines[0]
    fake = bigproc.FakeCgroup(root / "engine-a", usage_usec=1_000_000, memory=2**30, pids=engine.pids).write()
    group = cgroups.Cgroups(root)
    sampler = sampler_for(host)
    sampler.sample({"a": engine.leader}, {"a": group.place("a")})
    fake.usage_usec += 4_000_000  # the old engine, before it exited
    fake.write()
    again = group.place("a")
    host.advance(SECONDS, ticks_per_process=1)
    fake.usage_usec += 500_000  # the new one
    fake.write()

    load = sampler.sample({"a": engine.leader}, {"a": again})

    assert load.shards[0].cpu_cores == pytest.approx(0.5 / SECONDS)


def test_without_the_memory_controller_memory_is_the_members_rss(host, root):
    engine = host.engines[0]
    fake = bigproc.FakeCgroup(root / "engine-a", usage_usec=0, memory=None, pids=engine.pids).write()
    placement = cgroups.Cgroups(root).place("a")
    sampler = sampler_for(host)
    sampler.sample({"a": engine.leader}, {"a": placement})
    host.advance(SECONDS, ticks_per_process=1)
    fake.write()

    load = sampler.sample({"a": engine.leader}, {"a": placement})

    # The fixture's leader holds 25,600 pages and each worker 1,000.
    assert load.shards[0].rss_bytes == (25_600 + 3 * 1_000) * bigproc.PAGE


def test_an_engine_missing_from_its_cgroup_is_measured_by_its_processes(host, root):
    engine = host.engines[0]
    fake = bigproc.FakeCgroup(root / "engine-a", usage_usec=0, memory=2**30, pids=[]).write()
    placement = cgroups.Cgroups(root).place("a")
    sampler = sampler_for(host)
    sampler.sample({"a": engine.leader}, {"a": placement})
    host.advance(SECONDS, ticks_per_process=20)
    fake.usage_usec = 10_000_000
    fake.write()

    load = sampler.sample({"a": engine.leader}, {"a": placement})

    assert load.shards[0].cpu_cores == pytest.approx(4 * 20 / bigproc.CLOCK_TICKS / SECONDS)
    assert set(sampler.walker.members) == set(engine.pids)


def fixture_roots(tmp_path: Path, own: str, v2: bool = True) -> Roots:
    proc, sys_root = tmp_path / "proc", tmp_path / "sys"
    (proc / "self").mkdir(parents=True)
    (proc / "self" / "cgroup").write_text(f"0::{own}\n")
    mount = sys_root / "fs" / "cgroup"
    mount.mkdir(parents=True)
    if v2:
        (mount / "cgroup.controllers").write_text("cpu memory io\n")
    bigproc.cgroup_root(mount / own.lstrip("/"))
    return Roots(proc=proc, sys=sys_root)


def test_the_agents_own_service_cgroup_is_found(tmp_path):
    roots = fixture_roots(tmp_path, "/system.slice/llmgw-agent.service")
    found = cgroups.Cgroups.find(roots)
    assert found.root == roots.sys / "fs" / "cgroup" / "system.slice" / "llmgw-agent.service"


@pytest.mark.parametrize(
    ("own", "v2", "why"),
    [
        ("/user.slice/user-1000.slice/session-3.scope", True, "not a service: nobody delegated it"),
        ("/system.slice/llmgw-agent.service", False, "no cgroup v2 at /sys/fs/cgroup"),
    ],
)
def test_no_cgroup_is_taken_unasked_where_it_is_not_the_agents(tmp_path, own, v2, why):
    assert cgroups.Cgroups.find(fixture_roots(tmp_path, own, v2)) is None, why


def test_a_configured_root_is_used_and_a_missing_one_is_not(tmp_path, root):
    roots = Roots(proc=tmp_path / "no-proc", sys=tmp_path / "no-sys")
    assert cgroups.Cgroups.find(roots, str(root)).root == root
    assert cgroups.Cgroups.find(roots, str(tmp_path / "missing")) is None


def test_prepare_moves_the_agent_out_of_the_root(root):
    (root / "cgroup.procs").write_text("4321\n")
    (root / "agent").mkdir()
    (root / "agent" / "cgroup.procs").write_text("")

    cgroups.Cgroups(root).prepare(agent_pid=4321)

    assert (root / "agent" / "cgroup.procs").read_text() == "4321"


def test_the_engine_enters_its_cgroup_before_it_runs(tmp_path, root):
    runner = Runner(tmp_path / "logs", cgroups=cgroups.Cgroups(root), grace=1.0)
    runner.reconcile([spec("a", ["sleep", "30"])])
    try:
        pid = runner.process_groups()["a"]
        procs = root / "engine-a" / "cgroup.procs"
        wait_until(lambda: procs.exists() and procs.read_text().split() == [str(pid)], 10, "the engine's pid")
        # The shell became the engine: the pid the runner reports runs sleep, not sh.
        wait_until(lambda: psutil.Process(pid).name() == "sleep", 10, "the exec")
        assert runner.placements()["a"].path == root / "engine-a"
    finally:
        runner.stop_all(grace=1)


def test_a_missing_binary_still_fails_to_start_with_its_reason(tmp_path, root):
    runner = Runner(tmp_path / "logs", cgroups=cgroups.Cgroups(root))
    runner.reconcile([spec("a", ["/nonexistent/engine"])])
    status = runner.statuses()[0]
    assert status.state == "failed"
    assert "cannot start" in status.detail and "No such file" in status.detail
    runner.stop_all(grace=1)


def spec(shard: str, command: list[str]) -> protocol.ShardSpec:
    return protocol.ShardSpec(shard=shard, replica="r", model="", engine="command", command=command)


def writable_cgroup2() -> Path | None:
    """A cgroup v2 mount this test may create cgroups in (often none in containers and sandboxes)."""
    for line in Path("/proc/self/mounts").read_text().splitlines():
        fields = line.split()
        if len(fields) > 2 and fields[2] == "cgroup2" and os.access(fields[1], os.W_OK):
            return Path(fields[1])
    return None


BURNER = "while True: pass"


@pytest.mark.skipif(writable_cgroup2() is None, reason="no writable cgroup v2 mount here to create a real cgroup in")
def test_a_real_cgroup_measures_a_real_engine(tmp_path):
    root = writable_cgroup2() / f"llmgw-test-{uuid.uuid4().hex[:8]}"
    root.mkdir()
    runner = Runner(tmp_path / "logs", cgroups=cgroups.Cgroups(root), grace=1.0)
    try:
        runner.reconcile([spec("burn", [sys.executable, "-c", BURNER])])
        pid = runner.process_groups()["burn"]
        placement = runner.placements()["burn"]
        wait_until(lambda: str(pid) in (placement.path / "cgroup.procs").read_text().split(), 10, "the engine")
        assert f"/{root.name}/engine-burn" in Path(f"/proc/{pid}/cgroup").read_text()
        engine = psutil.Process(pid)
        sampler = Sampler()
        sampler.sample({"burn": pid}, {"burn": placement})
        before = engine.cpu_times()
        time.sleep(1.5)  # the measured window, not a wait for anything
        load = sampler.sample({"burn": pid}, {"burn": placement})
        after = engine.cpu_times()
        walked = dict(sampler.walker.members)
        rss = engine.memory_info().rss
    finally:
        runner.stop_all(grace=1)
        for leftover in (root / "engine-burn", root):
            if leftover.exists():
                leftover.rmdir()

    # CPU seconds over the sampler's own interval; psutil counts in 10 ms ticks, hence the absolute slack.
    psutil_seconds = after.user + after.system - before.user - before.system
    agent_seconds = load.shards[0].cpu_cores * load.interval_seconds
    assert walked == {}, "measured by walking its processes, not through its cgroup"
    assert psutil_seconds > 0.2, "the burner hardly ran: the comparison would prove nothing"
    assert agent_seconds == pytest.approx(psutil_seconds, rel=0.1, abs=0.03)
    assert load.shards[0].rss_bytes == pytest.approx(rss, rel=0.2)


def test_the_agent_starts_its_engines_under_the_configured_root(plane, make_agent, root):
    """Through the real entry point: the config's cgroup_root reaches the runner and the sampler."""
    agent = make_agent(
        plane, cgroup_root=str(root), shards=[{"shard": "s1", "engine": "command", "command": ["sleep", "60"]}]
    )
    agent.start()
    procs = root / "engine-s1" / "cgroup.procs"
    wait_until(lambda: "s1" in agent.runner.process_groups(), 10, "the shard")
    pid = agent.runner.process_groups()["s1"]
    wait_until(lambda: procs.exists() and procs.read_text().split() == [str(pid)], 10, "the engine in its cgroup")
    # The fixture cgroup keeps no counters, so the sampler reads what it can: the engine is walked instead.
    wait_until(
        lambda: any(b.load and [s.shard for s in b.load.shards] == ["s1"] for b in list(plane.heartbeats)),
        10,
        "the shard's load",
    )
    assert agent.sampler.own_pids == {pid}


def test_none_runs_engines_without_cgroups(plane, make_agent):
    agent = make_agent(plane, cgroup_root="none")
    assert agent.runner.cgroups is None


# A stand-in agent that starts in the delegated cgroup itself, as a systemd service does, then prepares it.
IN_ROOT_THEN_PREPARE = """
import os, sys
from pathlib import Path
from agent.cgroups import Cgroups
root = Path(sys.argv[1])
(root / "cgroup.procs").write_text(str(os.getpid()))
Cgroups(root).prepare()
print(Path("/proc/self/cgroup").read_text())
"""


@pytest.mark.skipif(writable_cgroup2() is None, reason="no writable cgroup v2 mount here to create a real cgroup in")
def test_a_real_agent_in_its_root_cgroup_moves_itself_into_a_leaf():
    root = writable_cgroup2() / f"llmgw-test-{uuid.uuid4().hex[:8]}"
    root.mkdir()
    try:
        done = subprocess.run(
            [sys.executable, "-c", IN_ROOT_THEN_PREPARE, str(root)],
            capture_output=True,
            text=True,
            timeout=30,
            cwd=Path(__file__).resolve().parents[2],
        )
    finally:
        for leftover in (root / cgroups.AGENT_LEAF, root):
            if leftover.exists():
                leftover.rmdir()
    assert done.returncode == 0, done.stderr
    assert f"/{root.name}/{cgroups.AGENT_LEAF}\n" in done.stdout
