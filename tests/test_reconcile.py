"""The reconciler over scenarios: placing, losing a node, draining, scaling."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from agent import protocol
from inventory import drainhold
from inventory.desired import orders
from inventory.liveness import mark_stale
from inventory.models import (
    AdminState,
    Allocation,
    Deployment,
    GPUClaim,
    Liveness,
    Node,
    NodeEvent,
    Replica,
    ReplicaState,
    Shard,
)
from inventory.operator import set_admin_state
from inventory.reconcile import RELEASE_GRACE, reconcile
from tests.factories import deployment, node

pytestmark = pytest.mark.django_db


def report_running(node_id: str) -> list[protocol.ShardSpec]:
    """What the node's agent would say once it runs every shard it was given."""
    wanted = orders(node_id).shards
    statuses = [protocol.ShardStatus(shard=s.shard, state="running", metrics_port=s.port) for s in wanted]
    return orders(node_id, statuses).shards


def shards_on(node_id: str) -> list[Shard]:
    return list(Shard.objects.filter(node_id=node_id).exclude(state=ReplicaState.FAILED))


def test_places_missing_replicas_on_schedulable_nodes_only(cluster):
    deployment(replicas=2, gpus_per_shard=4)
    result = reconcile()
    assert len(result.placed) == 2
    nodes = set(Shard.objects.values_list("node_id", flat=True))
    assert nodes == {"ready-1"}
    assert GPUClaim.objects.filter(node_id="ready-1").count() == 8


def test_replicas_of_one_deployment_spread_over_distinct_nodes(db):
    for name in ("a", "b", "c"):
        node(name)
    deployment(replicas=3, gpus_per_shard=1)
    reconcile()
    assert sorted(Shard.objects.values_list("node_id", flat=True)) == ["a", "b", "c"]


def test_a_second_pass_changes_nothing(db):
    node("a")
    deployment(replicas=2)
    reconcile()
    before = list(Allocation.objects.values_list("shard_id", "node_id", "replica_id"))
    again = reconcile()
    assert (again.created, again.placed, again.releasing, again.released) == ([], [], [], [])
    assert list(Allocation.objects.values_list("shard_id", "node_id", "replica_id")) == before


def test_lost_node_frees_its_replica_whole_and_it_is_rebuilt_elsewhere(db):
    node("a", fabrics={"ib": ["mlx5_0"]})
    node("b", fabrics={"ib": ["mlx5_1"]})
    node("c", fabrics={"ib": ["mlx5_2"]})
    # Two shards of 8 GPUs: one replica spans two nodes.
    deployment(shards_per_replica=2, gpus_per_shard=8)
    reconcile()
    first = Replica.objects.get()
    used = sorted(first.shards.values_list("node_id", flat=True))
    assert len(used) == 2
    silent_since = timezone.now() - timedelta(seconds=400)
    Node.objects.filter(pk=used[0]).update(liveness=Liveness.UNREACHABLE, last_heartbeat=silent_since)
    sweep = mark_stale()
    assert sweep.lost == [used[0]]
    first.refresh_from_db()
    assert first.state == ReplicaState.FAILED
    assert f"node {used[0]} lost" in first.reason
    # Whole: the healthy node's shard is freed too.
    assert not Allocation.objects.filter(replica_id=first.replica_id).exists()

    reconcile()
    rebuilt = Replica.objects.exclude(pk=first.pk).get()
    assert rebuilt.state == ReplicaState.PLACED
    assert used[0] not in set(rebuilt.shards.values_list("node_id", flat=True))
    assert rebuilt.replica_id != first.replica_id


def test_drain_runs_the_replacement_before_releasing_then_cordons(db, operator):
    a, _ = node("a"), node("b")
    deployment(replicas=1)
    reconcile()
    old = Replica.objects.get()
    assert old.shards.get().node_id == "a"
    report_running("a")
    old.refresh_from_db()
    assert old.state == ReplicaState.RUNNING

    set_admin_state(a, AdminState.DRAINING, operator, "kernel upgrade")
    reconcile()
    new = Replica.objects.get(replaces=old)
    assert new.shards.get().node_id == "b"
    old.refresh_from_db()
    assert old.state == ReplicaState.RUNNING, "the old replica serves until its replacement runs"
    assert orders("a").shards, "node a is still told to run it"
    reconcile()
    assert Node.objects.get(pk="a").admin_state == AdminState.DRAINING

    report_running("b")
    reconcile()
    old.refresh_from_db()
    assert old.state == ReplicaState.RELEASING
    assert orders("a").shards == [], "the agent is told to stop it"
    assert Allocation.objects.filter(node_id="a").exists(), "held until the engine has stopped"

    # The agent's next heartbeat no longer lists the shard: it stopped.
    orders("a", [])
    assert not Replica.objects.filter(pk=old.pk).exists()
    result = reconcile()
    assert result.cordoned == ["a"]
    a.refresh_from_db()
    assert (a.admin_state, a.admin_state_by) == (AdminState.CORDONED, "system")
    event = NodeEvent.objects.filter(node=a, kind=NodeEvent.Kind.ADMIN).first()
    assert (event.from_state, event.to_state, event.actor) == ("draining", "cordoned", "system")
    assert Replica.objects.get().pk == new.pk


def test_drain_of_an_empty_node_cordons_it_at_once(db, operator):
    a = node("a")
    set_admin_state(a, AdminState.DRAINING, operator, "retire")
    assert reconcile().cordoned == ["a"]
    assert reconcile().cordoned == []


def test_drain_stopped_before_the_replacement_runs_keeps_the_old_replica(db, operator):
    a, _ = node("a"), node("b")
    deployment()
    reconcile()
    set_admin_state(a, AdminState.DRAINING, operator, "maybe")
    reconcile()
    assert Replica.objects.count() == 2
    set_admin_state(a, AdminState.ACTIVE, operator, "changed my mind")
    reconcile()
    live = Replica.objects.exclude(state=ReplicaState.RELEASING)
    assert [s.node_id for r in live for s in r.shards.all()] == ["a"]


def test_releasing_shards_are_freed_after_the_grace_even_without_the_agent(db):
    node("a")
    d = deployment(replicas=1)
    reconcile()
    d.replicas = 0
    d.save()
    reconcile()
    assert Replica.objects.get().state == ReplicaState.RELEASING
    assert Allocation.objects.exists()
    # The grace follows the longest the drain's hold may keep the engine running.
    reconcile(now=timezone.now() + drainhold.deadline() + RELEASE_GRACE - timedelta(seconds=1))
    assert Allocation.objects.exists()
    reconcile(now=timezone.now() + drainhold.deadline() + RELEASE_GRACE + timedelta(seconds=1))
    assert not Allocation.objects.exists()
    assert not Replica.objects.exists()


def test_scale_up_and_down_releases_the_newest(db):
    for name in ("a", "b", "c"):
        node(name)
    d = deployment(replicas=1)
    reconcile()
    d.replicas = 3
    d.save()
    reconcile()
    assert sorted(Replica.objects.values_list("ordinal", flat=True)) == [1, 2, 3]
    d.replicas = 1
    d.save()
    result = reconcile()
    assert sorted(result.releasing) == ["llama-r2", "llama-r3"]
    assert Replica.objects.get(state=ReplicaState.PLACED).replica_id == "llama-r1"


def test_scale_down_removes_unplaced_replicas_first(db):
    node("a", gpus=1)
    d = deployment(replicas=2)
    reconcile()
    assert Replica.objects.filter(state=ReplicaState.PENDING).count() == 1
    d.replicas = 1
    d.save()
    reconcile()
    assert list(Replica.objects.values_list("replica_id", "state")) == [("llama-r1", ReplicaState.PLACED)]


def test_nothing_fits_leaves_the_replica_pending_with_a_reason(cluster):
    Node.objects.filter(pk="ready-1").update(admin_state=AdminState.CORDONED)
    node("small", gpus=1)
    deployment(gpus_per_shard=2)
    result = reconcile()
    replica = Replica.objects.get()
    assert replica.state == ReplicaState.PENDING
    assert replica.reason.startswith("cannot place: needs 2 × H100-80GB on one node: 5 nodes have H100-80GB")
    for part in ("2 cordoned", "1 lost", "1 unreachable", "1 has 1 free"):
        assert part in replica.reason
    assert result.unplaced == {replica.replica_id: replica.reason.removeprefix("cannot place: ")}


def test_an_agent_reporting_a_failed_shard_fails_the_replica_and_it_is_rebuilt(db):
    node("a")
    node("b")
    deployment()
    reconcile()
    replica = Replica.objects.get()
    node_id = replica.shards.get().node_id
    spec = orders(node_id).shards[0]
    left = orders(node_id, [protocol.ShardStatus(shard=spec.shard, state="failed", detail="CUDA error")]).shards
    assert left == []
    replica.refresh_from_db()
    assert replica.state == ReplicaState.FAILED and "CUDA error" in replica.reason
    reconcile()
    assert Replica.objects.filter(state=ReplicaState.PLACED).count() == 1


def test_failed_replicas_are_forgotten_after_an_hour(db):
    node("a")
    deployment()
    reconcile()
    Node.objects.filter(pk="a").update(liveness=Liveness.LOST)
    reconcile()
    assert Replica.objects.filter(state=ReplicaState.FAILED).count() == 1
    reconcile(now=timezone.now() + timedelta(hours=2))
    assert not Replica.objects.filter(state=ReplicaState.FAILED).exists()


def test_a_pass_costs_the_same_queries_whatever_the_fleet_size(db):
    def queries_for(nodes: int, prefix: str) -> int:
        for i in range(nodes):
            node(f"{prefix}{i}", fabrics={"ib": [f"mlx5_{i}"]})
        deployment(f"{prefix}-one", replicas=3)
        deployment(f"{prefix}-two", replicas=2, shards_per_replica=2, gpus_per_shard=8)
        with CaptureQueriesContext(connection) as captured:
            reconcile()
        Node.objects.all().delete()
        Deployment.objects.all().delete()
        return len(captured)

    assert queries_for(4, "s") == queries_for(40, "l")
