"""The agent against a stand-in control plane over real HTTP: registration, tokens, replies, rejections."""

import logging
import shutil
import stat
from pathlib import Path

import msgspec

from agent import protocol
from agent.client import TokenStore
from agent.loop import Tuning
from agent.procfs import Roots
from devstack.polling import wait_until
from tests.agent.conftest import FAST


def test_registers_stores_the_token_0600_and_heartbeats(plane, make_agent, tmp_path):
    agent = make_agent(plane).start()
    wait_until(lambda: plane.accepted() >= 3, 10, "three heartbeats")
    [registration] = plane.registrations
    assert registration.node_id == "node-under-test"
    assert registration.inventory.host.cpus > 0 and registration.inventory_hash
    token_file = tmp_path / "state" / "node-token"
    assert stat.S_IMODE(token_file.stat().st_mode) == 0o600
    assert TokenStore(tmp_path / "state").load("node-under-test") == agent.token
    beats = list(plane.heartbeats)
    assert all(b.load is not None and b.load.cpus > 0 for b in beats)
    assert all(b.inventory_hash == registration.inventory_hash for b in beats)
    # The registration carried the inventory; unchanged, it is not sent again.
    assert all(b.inventory is None for b in beats)


def test_the_token_is_reused_after_a_restart(plane, make_agent):
    first = make_agent(plane).start()
    wait_until(lambda: plane.accepted() >= 1, 10, "a heartbeat")
    first.stop()
    second = make_agent(plane).start()
    before = plane.accepted()
    wait_until(lambda: plane.accepted() >= before + 2, 10, "heartbeats after the restart")
    assert len(plane.registrations) == 1
    assert second.token == first.token


def test_a_401_leads_to_one_registration(plane, make_agent, caplog):
    agent = make_agent(plane).start()
    wait_until(lambda: plane.accepted() >= 1, 10, "a heartbeat")
    old = agent.token
    with plane.lock:
        plane.tokens.clear()  # the control plane forgot every node
    wait_until(lambda: len(plane.registrations) == 2, 10, "a second registration")
    before = plane.accepted()
    wait_until(lambda: plane.accepted() >= before + 3, 10, "heartbeats with the new token")
    assert len(plane.registrations) == 2
    assert agent.token != old
    assert "registering again" in caplog.text


def test_a_refused_join_token_is_retried_and_the_file_re_read(plane, make_agent, tmp_path, caplog):
    (tmp_path / "join-token").write_text("wrong")
    agent = make_agent(plane).start()
    wait_until(lambda: agent.beats_failed >= 3, 10, "failed registrations")
    assert "join token refused" in caplog.text
    assert agent.samples > 0
    (tmp_path / "join-token").write_text(plane.join_token + "\n")
    wait_until(lambda: plane.accepted() >= 1, 10, "a heartbeat after the token was fixed")


def test_a_rejection_is_logged_and_the_agent_keeps_running(plane, make_agent, caplog):
    agent = make_agent(plane).start()
    wait_until(lambda: plane.accepted() >= 1, 10, "a heartbeat")
    plane.mode = "reject"
    before = plane.attempts
    with caplog.at_level(logging.WARNING):
        wait_until(lambda: plane.attempts >= before + 5, 10, "more attempts while rejected")
    assert "load.cpu_percent: must be at most 100" in caplog.text
    plane.mode = "ok"
    accepted = plane.accepted()
    wait_until(lambda: plane.accepted() > accepted, 10, "heartbeats accepted again")
    assert agent.beats_failed == 0


def test_inventory_is_sent_when_it_changes_and_when_asked(plane, make_agent):
    agent = make_agent(plane).start()
    wait_until(lambda: plane.accepted() >= 1, 10, "a heartbeat")
    inventory, _ = agent.discovered
    agent._set_inventory(msgspec.structs.replace(inventory, labels={"new": "label"}))
    wait_until(lambda: any(b.inventory is not None for b in plane.heartbeats), 10, "the changed inventory")
    changed = next(b for b in plane.heartbeats if b.inventory is not None)
    assert changed.inventory.labels == {"new": "label"}
    # Once accepted it is not sent again...
    count = plane.accepted()
    wait_until(lambda: plane.accepted() >= count + 3, 10, "more heartbeats")
    assert all(b.inventory is None for b in list(plane.heartbeats)[count:])
    # ...until the control plane asks for it.
    plane.inventory_wanted = True
    count = plane.accepted()
    wait_until(lambda: plane.accepted() >= count + 3, 10, "heartbeats after asking")
    assert any(b.inventory is not None for b in list(plane.heartbeats)[count:])


def demo_spec(shard: str) -> dict:
    return {"shard": shard, "engine": "command", "command": ["sleep", "60"]}


def test_reply_shards_decide_what_runs(plane, make_agent):
    agent = make_agent(plane, shards=[demo_spec("from-config")], command_programs=["sleep"]).start()
    # No list from the control plane yet: the config's shards run.
    wait_until(lambda: "from-config" in agent.runner.process_groups(), 10, "the configured shard")
    plane.shards = [
        protocol.ShardSpec(shard="placed-1", replica="rep-1", model="m", engine="command", command=["sleep", "61"]),
    ]
    wait_until(lambda: set(agent.runner.process_groups()) == {"placed-1"}, 10, "exactly the placed shard")
    wait_until(
        lambda: any([s.shard for s in b.shards] == ["placed-1"] for b in list(plane.heartbeats)), 10, "its status"
    )
    plane.shards = []
    wait_until(lambda: agent.runner.process_groups() == {}, 10, "nothing running")
    plane.shards = None
    wait_until(lambda: set(agent.runner.process_groups()) == {"from-config"}, 10, "the configured shard again")


def test_shard_load_and_status_are_reported(plane, make_agent):
    make_agent(plane, shards=[demo_spec("s1")]).start()

    def reported():
        beats = list(plane.heartbeats)
        return beats and [s.shard for s in beats[-1].load.shards] == ["s1"] and beats[-1].shards[0].pid > 0

    wait_until(reported, 10, "the shard's load and status")
    last = list(plane.heartbeats)[-1]
    assert last.shards[0].state in ("starting", "running")
    assert last.load.shards[0].rss_bytes > 0


def test_the_reply_interval_is_used(plane, make_agent):
    plane.interval = 0.02
    agent = make_agent(plane).start()
    wait_until(lambda: agent.interval == 0.02, 10, "the new interval")


def test_a_change_found_by_rediscovery_is_sent(plane, make_agent, tmp_path):
    models = tmp_path / "models"
    models.mkdir()
    tuning = Tuning(**{**FAST.__dict__, "rediscover_every": 0.05})
    make_agent(plane, tuning=tuning, model_dirs=[str(models)]).start()
    wait_until(lambda: plane.accepted() >= 1, 10, "a heartbeat")
    (models / "new.gguf").write_bytes(b"x")

    def weights_sent():
        return any(
            b.inventory and [w.path for w in b.inventory.weights] == [str(models / "new.gguf")]
            for b in list(plane.heartbeats)
        )

    wait_until(weights_sent, 10, "the new weights in a heartbeat")


def test_engine_groups_left_by_a_killed_agent_are_stopped_at_start(plane, make_agent, tmp_path):
    shard = {"shard": "s1", "engine": "command", "command": ["sleep", "60"]}
    first = make_agent(plane, shards=[shard])
    first.start_up()
    pid = first.runner.process_groups()["s1"]
    # The first agent is SIGKILLed: nothing stops its engine. The next one starts.
    second = make_agent(plane, shards=[shard]).start()
    wait_until(lambda: second.runner.process_groups().get("s1") not in (None, pid), 10, "a new engine")
    first.runner.poll()
    assert first.runner.shards["s1"].process.returncode is not None, "the old engine still runs"


def test_a_shard_the_agent_could_not_report_on_is_ignored_and_a_refused_one_reported(plane, make_agent, caplog):
    agent = make_agent(plane, command_programs=["sleep"]).start()
    plane.shards = [
        protocol.ShardSpec(shard="bad/id", replica="r", model="m", engine="command", command=["sleep", "60"]),
        protocol.ShardSpec(shard="empty", replica="r", model="m", engine="command", command=[]),
        protocol.ShardSpec(shard="good", replica="r", model="m", engine="command", command=["sleep", "60"]),
    ]
    wait_until(lambda: set(agent.runner.process_groups()) == {"good"}, 10, "only the good shard")
    count = plane.accepted()
    wait_until(lambda: plane.accepted() >= count + 2, 10, "heartbeats still accepted")
    assert "ignoring shard 'bad/id'" in caplog.text
    last = list(plane.heartbeats)[-1]
    assert {s.shard: s.state for s in last.shards} == {"good": last.shards[0].state, "empty": "failed"}


def test_when_proc_cannot_be_read_no_load_is_sent_rather_than_an_old_one(plane, make_agent, tmp_path):
    # /proc is a link swapped in one step, so no reading ever sees half a tree.
    first, later = tmp_path / "proc-first", tmp_path / "proc-later"
    shutil.copytree(Path(__file__).parent / "fixtures" / "proc", first)
    shutil.copytree(Path(__file__).parent / "fixtures" / "proc-later", later)
    proc = tmp_path / "proc"
    proc.symlink_to(first)
    agent = make_agent(plane, roots=Roots(proc=proc, sys=tmp_path, etc=tmp_path))
    # Take the first reading here, so that it is surely of the first tree.
    agent.start_up()
    agent.start()
    swap = tmp_path / "proc-swap"
    swap.symlink_to(later)
    swap.replace(proc)
    uptime = iter(range(1010, 1_000_000))

    def the_clock_moves_and_a_load_was_sent() -> bool:
        # A fixed uptime gives one load only, for one 50 ms sample, which a busy machine's beater can miss:
        # moving the later tree's clock (replaced whole, never half written) makes every sample a load.
        (later / "uptime.new").write_text(f"{next(uptime)}.00 3970.00\n")
        (later / "uptime.new").replace(later / "uptime")
        return any(b.load is not None for b in list(plane.heartbeats))

    wait_until(the_clock_moves_and_a_load_was_sent, 10, "a heartbeat with the load")
    (proc / "stat").write_text("garbage\n")
    count = plane.accepted()
    wait_until(lambda: plane.accepted() >= count + 3, 10, "more heartbeats")
    assert list(plane.heartbeats)[-1].load is None
    assert agent.beats_failed == 0
