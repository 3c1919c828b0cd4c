"""The control plane's half of provisioning: which engines a node is asked for, and what it reported."""

from __future__ import annotations

import pytest

from agent import protocol
from inventory.engine_wants import install_state, wants
from inventory.models import Engine, EngineInstall, Node, Shard
from inventory.reconcile import reconcile
from tests.placement_fleet import deployment, node

pytestmark = pytest.mark.django_db


def test_a_node_is_asked_for_the_engines_of_its_shards_once_each_with_the_variant_its_profile_needs():
    node("a", gpus=8, cpus=64)
    deployment("llama-gpu", engine=Engine.LLAMA_CPP, replicas=2, gpus_per_shard=1)
    deployment("llama-cpu", engine=Engine.LLAMA_CPP, gpus_per_shard=0, gpu_class="", cpu_cores_per_shard=2)
    deployment("qwen", engine=Engine.SGLANG, gpus_per_shard=2)
    deployment("sim", engine=Engine.DEMO, gpus_per_shard=0, gpu_class="")
    reconcile()
    shards = Shard.objects.filter(node_id="a").select_related("replica__deployment")
    assert shards.count() == 5
    assert wants(shards) == [
        protocol.EngineWant(engine="llama.cpp", variant="cpu"),
        protocol.EngineWant(engine="llama.cpp", variant="cuda"),
        protocol.EngineWant(engine="sglang", variant="cuda"),
    ]


def test_the_install_state_is_what_the_agent_reported_the_most_hopeful_variant_first():
    node("a")
    a = Node.objects.get(pk="a")
    assert install_state("a", "llama.cpp") == ("", "")
    EngineInstall.objects.create(node=a, engine="llama.cpp", variant="cuda", state="unsupported", detail="no GPU")
    EngineInstall.objects.create(node=a, engine="llama.cpp", variant="cpu", state="failed", detail="exit 2")
    assert install_state("a", "llama.cpp") == ("failed", "exit 2")
    EngineInstall.objects.create(node=a, engine="llama.cpp", version="0.3.36", variant="cpu", state="ready")
    assert install_state("a", "llama.cpp") == ("ready", "")
    # Engines llmgw does not install need nothing.
    assert install_state("a", "demo") == ("ready", "")
