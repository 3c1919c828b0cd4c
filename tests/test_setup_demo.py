"""setup_demo, as `make run` calls it: an agent config that looks where the demo's model goes, and
SmolLM2-135M-Instruct on llama.cpp placed once the agent reports the weights there, asking it for llama.cpp."""

from __future__ import annotations

import io

import pytest
from django.core.management import call_command

from agent import config as agent_config
from agent import protocol
from agent.model_fetch import SMOLLM2_135M_INSTRUCT
from inventory.desired import orders
from inventory.models import Deployment, Engine, Replica, ReplicaState
from inventory.reconcile import reconcile
from tests.factories import node

pytestmark = pytest.mark.django_db


def setup_demo(var, *flags: str) -> None:
    (var / "join-token").write_text("demo-join")  # devstack.stack writes it before the agent starts
    call_command("setup_demo", f"--var-dir={var}", *flags, stdout=io.StringIO())


def test_the_agent_looks_for_models_where_the_demo_model_is_fetched(tmp_path):
    setup_demo(tmp_path)
    config = agent_config.load(tmp_path / "agent.yaml")
    assert config.model_dirs == [str(tmp_path / "models")]
    smollm2 = Deployment.objects.get(name="smollm2")
    assert smollm2.model_source == str(tmp_path / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf")
    assert (smollm2.engine, smollm2.gpus_per_shard) == (Engine.LLAMA_CPP, 0)


def test_a_config_from_before_the_model_gets_the_model_directory_and_keeps_the_rest(tmp_path):
    (tmp_path / "agent.yaml").write_text(
        f"control_plane: http://127.0.0.1:8000\njoin_token_file: {tmp_path / 'join-token'}\ninterval: 7\n"
    )
    setup_demo(tmp_path)
    setup_demo(tmp_path)
    config = agent_config.load(tmp_path / "agent.yaml")
    assert (config.interval, config.model_dirs) == (7, [str(tmp_path / "models")])


def test_the_model_waits_for_its_weights_then_asks_the_node_for_llama_cpp(tmp_path):
    setup_demo(tmp_path)
    path = str(tmp_path / "models" / SMOLLM2_135M_INSTRUCT.filename)
    node("laptop", gpus=0, cpus=2, memory_gb=8, weights=[])
    reconcile()
    replica = Replica.objects.get(deployment__name="smollm2")
    assert replica.state == ReplicaState.PENDING
    assert f"lacks {path}" in replica.reason
    node("laptop", gpus=0, cpus=2, memory_gb=8, weights=[path])
    reconcile()
    told = orders("laptop")
    specs, engines = told.shards, told.engines
    (spec,) = [s for s in specs if s.engine == Engine.LLAMA_CPP]
    assert spec.command[:3] == ["llama-server", "--model", path]
    assert spec.command[-2:] == ["--chat-template", "chatml"]
    assert protocol.EngineWant(engine="llama.cpp", variant="cpu") in engines


def test_no_real_model_makes_the_stand_in_engine_alone(tmp_path):
    setup_demo(tmp_path, "--no-real-model")
    assert list(Deployment.objects.values_list("name", flat=True)) == ["demo"]
