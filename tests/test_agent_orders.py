"""What the control plane tells agents to run, against what agents agree to run (agent/admission.py).

Every kind the control plane places passes its agent's checks, so the checks refuse no
real deployment; and a shard list poisoned in Redis, which the control plane sends on
as it stands, reaches the agent and runs nothing there.
"""

from __future__ import annotations

import pytest

from agent import admission, enginekinds, protocol
from agent import config as agent_config
from agent.loop import Agent
from inventory.desired import orders
from inventory.models import Deployment
from inventory.reconcile import reconcile
from livestate import shardlists
from tests.agentapi import JOIN_TOKEN, a_load, heartbeat, register, reply_of
from tests.factories import node

pytestmark = pytest.mark.django_db

MODELS = "/srv/models"
ALLOWED = admission.Allowed(model_dirs=(MODELS,), command_programs=("/opt/engine",))


@pytest.mark.parametrize("kind", [k for k in enginekinds.KINDS if k.placeable], ids=lambda k: k.name)
def test_every_kind_placed_passes_its_agents_checks(kind):
    node("a", gpus=8, fabrics={"ib-a": ["mlx5_0"]})
    node("b", gpus=8, fabrics={"ib-a": ["mlx5_1"]})
    Deployment.objects.create(
        name="d",
        engine=kind.name,
        model_source=f"{MODELS}/llama-70b",
        arguments="/opt/engine --port {port} --model {model}" if kind.free_form else "--max-model-len 4096",
        shards_per_replica=2,
        gpus_per_shard=8,
    )
    reconcile()
    specs = [*orders("a").shards, *orders("b").shards]
    assert len(specs) == 2
    assert [admission.shard_refusal(spec, ALLOWED) for spec in specs] == [None, None]


def test_a_shard_list_poisoned_in_redis_is_sent_on_and_refused_by_the_agent(client, settings, redis_client, tmp_path):
    settings.LLMGW_JOIN_TOKEN = JOIN_TOKEN
    token = register(client, "gpu-1")
    reply_of(heartbeat(client, token, protocol.Heartbeat(load=a_load())))
    version, _ = shardlists.read("gpu-1")
    assert version is not None
    marker = tmp_path / "owned"
    poisoned = [
        protocol.ShardSpec(
            shard="s1", replica="r1", model="m", engine="command", command=["/bin/sh", "-c", f"touch {marker}"]
        ),
        protocol.ShardSpec(
            shard="s2", replica="r1", model="m", engine="vllm", command=["vllm", "serve", "m"],
            env={"LD_PRELOAD": str(tmp_path / "evil.so")},
        ),
    ]  # fmt: skip
    wants = [protocol.EngineWant(engine="vllm", version="../../etc/ssl/private/x", variant="cpu")]
    shardlists.store("gpu-1", shardlists.CachedShards(version, [], poisoned, wants))

    reply = reply_of(heartbeat(client, token, protocol.Heartbeat(load=a_load())))
    # The control plane trusts its cache: the poison is in the reply.
    assert reply.shards == poisoned and reply.engines == wants

    token_file = tmp_path / "join"
    token_file.write_text("unused")
    config = agent_config.from_mapping(
        {
            "control_plane": "http://127.0.0.1:9",
            "join_token_file": str(token_file),
            "state_dir": str(tmp_path / "state"),
            "node_id": "gpu-1",
            "engines": {},
            "cgroup_root": "none",
            "model_dirs": [str(tmp_path)],
        }
    )
    agent = Agent(config)
    try:
        agent._apply(reply)
        assert agent.runner.process_groups() == {}
        statuses = {s.shard: (s.state, s.detail) for s in agent.shard_statuses()}
        assert statuses == {
            "s1": ("failed", "refused: '/bin/sh' is not among this node's command_programs"),
            "s2": ("failed", "refused: the environment variable 'LD_PRELOAD' is not one the control plane sets"),
        }
        (install,) = agent.provisioner.entries()
        assert install.state == "unsupported" and install.detail.startswith("refused: the version")
        assert not marker.exists()
    finally:
        agent.provisioner.stop()
        agent.runner.stop_all()
