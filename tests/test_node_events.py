"""Replicas, engines and installs leave NodeEvents on the nodes they concern, once per change."""

from __future__ import annotations

import pytest
from django.utils import timezone

from agent import protocol
from devstack.ports import free_port
from inventory.desired import orders
from inventory.models import AdminState, NodeEvent, Replica, ReplicaState, Shard
from inventory.operator import set_admin_state
from inventory.reconcile import reconcile
from inventory.registration import upsert_inventory
from inventory.replicas import begin_release, fail_replicas
from tests.factories import deployment, make_inventory, node, place

pytestmark = pytest.mark.django_db


def events(kind: str, node_id: str | None = None) -> list[tuple[str, str, str, str]]:
    rows = NodeEvent.objects.filter(kind=kind).order_by("at", "id")
    if node_id:
        rows = rows.filter(node_id=node_id)
    return list(rows.values_list("node_id", "from_state", "to_state", "reason"))


def test_a_placement_is_an_event_on_each_node_of_the_replica(cluster):
    place("llama", {"ready-1": [0], "cordoned-1": [1]})
    assert events(NodeEvent.Kind.REPLICA) == [
        ("cordoned-1", "pending", "placed", "replica llama-r1: placed"),
        ("ready-1", "pending", "placed", "replica llama-r1: placed"),
    ]


def test_reconcile_records_a_placement_once(cluster):
    deployment()
    reconcile()
    reconcile()
    assert events(NodeEvent.Kind.REPLICA) == [("ready-1", "pending", "placed", "replica llama-r1: placed")]


def test_a_failed_replica_and_its_rebuild_are_events_that_say_why(cluster):
    deployment()
    reconcile()
    fail_replicas(["llama-r1"], "node ready-1 lost")
    reconcile()
    assert events(NodeEvent.Kind.REPLICA) == [
        ("ready-1", "pending", "placed", "replica llama-r1: placed"),
        ("ready-1", "", "failed", "replica llama-r1: node ready-1 lost"),
        ("ready-1", "pending", "placed", "replica llama-r2: placed, rebuilding llama-r1 (failed: node ready-1 lost)"),
    ]


def test_a_drained_replicas_replacement_names_it(cluster, operator):
    deployment()
    reconcile()
    node("ready-2")
    set_admin_state(cluster["ready-1"], AdminState.DRAINING, operator, "maintenance")
    reconcile()
    assert events(NodeEvent.Kind.REPLICA, "ready-2") == [
        ("ready-2", "pending", "placed", "replica llama-r2: placed, rebuilding llama-r1 (drained)")
    ]


def test_a_release_is_an_event_once(cluster):
    replica = place("llama", {"ready-1": [0]})
    begin_release([replica], "scaled down to 0")
    begin_release([Replica.objects.get()], "scaled down to 0")
    assert events(NodeEvent.Kind.REPLICA)[1:] == [("ready-1", "", "releasing", "replica llama-r1: scaled down to 0")]


def running(shard: str, restarts: int = 0) -> protocol.ShardStatus:
    return protocol.ShardStatus(shard=shard, state="running", pid=42, metrics_port=9100, restarts=restarts)


def test_an_engine_restart_is_an_event_once_and_an_unchanged_beat_is_none(cluster):
    place("llama", {"ready-1": [0]})
    orders("ready-1", [running("llama-r1-s0")])
    orders("ready-1", [running("llama-r1-s0")])
    assert events(NodeEvent.Kind.ENGINE) == []
    orders("ready-1", [running("llama-r1-s0", restarts=2)])
    orders("ready-1", [running("llama-r1-s0", restarts=2)])
    assert events(NodeEvent.Kind.ENGINE) == [
        ("ready-1", "", "restarted", "llama-r1-s0 restarted (0 → 2 restarts): running, 2 restarts")
    ]


def test_an_engine_failure_is_an_event_with_its_exit_code_and_last_line(cluster):
    place("llama", {"ready-1": [0]})
    failed = protocol.ShardStatus(
        shard="llama-r1-s0", state="failed", exit_code=137, detail="loading weights\nCUDA out of memory"
    )
    orders("ready-1", [failed])
    orders("ready-1", [failed])
    assert events(NodeEvent.Kind.ENGINE) == [
        ("ready-1", "", "failed", "llama-r1-s0: engine failed, exit code 137, CUDA out of memory")
    ]
    assert Shard.objects.get().state == ReplicaState.FAILED


def store(provision: list[protocol.EngineInstall]) -> None:
    upsert_inventory("ready-1", make_inventory("ready-1.example", gpus=8, provision=provision), now=timezone.now())


def test_an_install_is_an_event_at_each_state_change_only(cluster):
    store([protocol.EngineInstall(engine="vllm", variant="cuda", state="installing")])
    store([protocol.EngineInstall(engine="vllm", variant="cuda", state="installing")])
    store([protocol.EngineInstall(engine="vllm", version="0.6.3", variant="cuda", state="ready")])
    store(
        [protocol.EngineInstall(engine="vllm", version="0.6.3", variant="cuda", state="failed", detail="a\nno space")]
    )
    assert events(NodeEvent.Kind.INSTALL) == [
        ("ready-1", "", "installing", "vllm cuda"),
        ("ready-1", "installing", "ready", "vllm 0.6.3 cuda"),
        ("ready-1", "ready", "failed", "vllm 0.6.3 cuda: no space"),
    ]


@pytest.fixture
def viewer_client(client, viewer):
    client.force_login(viewer)
    return client


def test_the_node_page_lists_the_new_kinds_with_their_reason_escaped(viewer_client, cluster, settings):
    settings.PROMETHEUS_URL = f"http://127.0.0.1:{free_port()}"
    store([protocol.EngineInstall(engine="vllm", state="failed", detail="<b>boom</b>")])
    place("llama", {"ready-1": [0]})
    html = viewer_client.get("/nodes/ready-1/charts/?range=1h", HTTP_HX_REQUEST="true").content.decode()
    assert "Install: — → failed · “vllm: &lt;b&gt;boom&lt;/b&gt;”" in html
    assert "<b>boom</b>" not in html
    assert "Replica: pending → placed · “replica llama-r1: placed” — system" in html
