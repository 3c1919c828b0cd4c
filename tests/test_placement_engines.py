"""Placement and engine installs: a node is used once its engine is ready there or may be installed, never
where the install failed or cannot run, and a replica waiting for an install that fails is rebuilt elsewhere."""

from __future__ import annotations

import pytest

from agent import protocol
from inventory.desired import orders
from inventory.models import Replica, ReplicaState, Shard
from inventory.reconcile import reconcile
from inventory.registration import upsert_inventory
from tests.factories import deployment, make_inventory, node

pytestmark = pytest.mark.django_db

LOG_TAIL = "[ 40%] Building CXX object ggml.cpp.o\ng++: fatal error: Killed signal terminated program cc1plus {x}"
LLAMA = dict(engine="llama.cpp", model_source="/models/gemma.gguf", gpus_per_shard=0, gpu_class="")


def cpu_node(name: str) -> None:
    node(name, gpus=0)


def report(name: str, *installs: protocol.EngineInstall) -> None:
    """The node's agent sends its inventory with these installs, as a heartbeat would."""
    inventory = make_inventory(f"{name}.example", memory_total_bytes=512 * 2**30, cpus=192, provision=list(installs))
    upsert_inventory(name, inventory)


def llama(
    state: protocol.InstallState, detail: str = "", variant: str = "cpu", version: str = "0.3.36"
) -> protocol.EngineInstall:
    return protocol.EngineInstall(engine="llama.cpp", version=version, variant=variant, state=state, detail=detail)


def placed_on() -> list[str]:
    return list(Shard.objects.filter(state=ReplicaState.PLACED).values_list("node_id", flat=True))


def test_a_node_that_never_installed_the_engine_is_used_and_asked_to_install_it():
    cpu_node("a")
    deployment(**LLAMA)
    reconcile()
    assert placed_on() == ["a"]
    assert orders("a").engines == [protocol.EngineWant(engine="llama.cpp", variant="cpu")]


def test_a_node_whose_install_failed_is_passed_over_and_the_reason_quotes_the_last_line():
    cpu_node("a")
    cpu_node("b")
    report("a", llama("failed", LOG_TAIL))
    deployment(**LLAMA)
    reconcile()
    assert placed_on() == ["b"]
    Replica.objects.all().delete()
    report("b", llama("unsupported", "cpu: no compiler"))
    result = reconcile()
    assert result.unplaced == {
        "llama-r2": "needs nothing in particular on one node: 2 nodes, "
        "1 has llama.cpp (cpu) failed: g++: fatal error: Killed signal terminated program cc1plus {x}, "
        "1 has llama.cpp (cpu) unsupported: cpu: no compiler"
    }


def test_another_version_ready_or_an_install_under_way_does_not_block():
    cpu_node("a")
    cpu_node("b")
    report("a", llama("failed", "exit 2", version="0.3.35"), llama("ready"))
    report("b", llama("installing", "building llama-server: 42 %"))
    deployment(**LLAMA, replicas=2)
    reconcile()
    assert sorted(placed_on()) == ["a", "b"]


def test_cuda_unsupported_on_a_node_excludes_it_for_gpu_replicas_only():
    node("g", gpus=2)
    report_gpu = make_inventory("g.example", gpus=2, provision=[llama("unsupported", "cuda: no nvcc", variant="cuda")])
    upsert_inventory("g", report_gpu)
    deployment("gpu", **{**LLAMA, "gpus_per_shard": 1, "gpu_class": ""})
    result = reconcile()
    assert "1 has llama.cpp (cuda) unsupported: cuda: no nvcc" in result.unplaced["gpu-r1"]
    deployment("cpu", **LLAMA)
    reconcile()
    assert placed_on() == ["g"]


def test_a_replica_waiting_for_an_install_that_fails_is_rebuilt_elsewhere_and_the_install_still_asked_for():
    cpu_node("a")
    deployment(**LLAMA)
    reconcile()
    assert placed_on() == ["a"]
    cpu_node("b")
    report("a", llama("failed", LOG_TAIL))
    result = reconcile()
    assert result.failed == ["llama-r1"]
    failed = Replica.objects.get(replica_id="llama-r1")
    assert failed.reason == (
        "llama.cpp cannot run on a: failed: g++: fatal error: Killed signal terminated program cc1plus {x}"
    )
    assert placed_on() == ["b"]
    # Node a's agent keeps the failed install, retried with its own backoff, rather than forgetting it
    # and being asked afresh (without backoff) by the next placement there.
    told = orders("a")
    assert (told.shards, told.engines) == ([], [protocol.EngineWant(engine="llama.cpp", variant="cpu")])
    reconcile()
    assert Replica.objects.get(replica_id="llama-r1").state == ReplicaState.FAILED
