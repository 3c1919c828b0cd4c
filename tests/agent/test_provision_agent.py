"""A real agent asked for an engine by the control plane: it builds it without missing a beat, then runs its shard."""

from __future__ import annotations

import os

from agent import protocol
from devstack.polling import wait_until
from tests.agent.stand_ins import seed_sdist


def provision_seen(plane) -> list[tuple[str, str]]:
    with plane.lock:
        beats = list(plane.heartbeats)
    return [(p.state, p.detail) for beat in beats if beat.inventory for p in beat.inventory.provision]


def test_an_engine_wanted_by_the_control_plane_is_built_reported_and_then_run(plane, make_agent, tmp_path):
    cache = tmp_path / "cache"
    seed_sdist(cache, "9.9.9")
    plane.engines = [protocol.EngineWant(engine="llama.cpp", version="9.9.9")]
    # The command names the program only, as the control plane's do.
    models = tmp_path / "models"
    models.mkdir()
    plane.shards = [
        protocol.ShardSpec(
            shard="s1", replica="r1", model=str(models / "q.gguf"), engine="llama.cpp", command=["llama-server"]
        )
    ]
    agent = make_agent(plane, engine_cache=str(cache), model_dirs=[str(models)]).start()

    wait_until(lambda: ("ready", "") in provision_seen(plane), 120, "a heartbeat reporting the engine ready")
    seen = provision_seen(plane)
    before = seen[: seen.index(("ready", ""))]
    # Beats went on during the build, and each change of step went with one.
    assert {"configuring (cmake)", "building llama-server"} <= {detail for state, detail in before}
    assert {state for state, _ in before} == {"installing"}

    # The shard waited for its engine and runs the installed binary.
    wait_until(lambda: [s.state for s in agent.runner.statuses()] == ["running"], 30, "the shard to run")
    (pid,) = agent.runner.process_groups().values()
    installed = tmp_path / "state" / "engines" / "llama.cpp" / "9.9.9-cpu" / "bin" / "llama-server"
    assert os.readlink(f"/proc/{pid}/exe") == str(installed)
    with plane.lock:
        beats = list(plane.heartbeats)
    first_ready = next(i for i, b in enumerate(beats) if b.inventory and b.inventory.provision[0].state == "ready")
    assert all(not beat.shards for beat in beats[:first_ready])

    # No longer wanted: forgotten, and the inventory says so.
    plane.engines, plane.shards = [], []
    wait_until(lambda: agent.provisioner.entries() == [], 10, "the engine to be forgotten")
