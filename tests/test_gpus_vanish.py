"""GPUs that leave a node's inventory take their replica's claims with them (issue 17, item 5)."""

from __future__ import annotations

import pytest

from agent import protocol
from inventory.models import GPU, GPUClaim, GPUCondition, Replica, ReplicaState, Shard
from inventory.reconcile import reconcile
from tests.agentapi import JOIN_TOKEN, heartbeat, post, register, reply_of
from tests.factories import deployment, make_inventory

pytestmark = [pytest.mark.django_db]


@pytest.fixture(autouse=True)
def _join_token(settings, redis_client):
    settings.LLMGW_JOIN_TOKEN = JOIN_TOKEN


@pytest.fixture
def eight_gpu_replica(client):
    """Two nodes of eight H100s; one replica of eight GPUs placed on one of them. Returns (tokens, holder, replica)."""
    tokens = {name: register(client, name, gpus=8) for name in ("gpu-a", "gpu-b")}
    deployment("big", gpus_per_shard=8)
    assert reconcile().placed == ["big-r1"]
    shard = Shard.objects.get()
    running = [protocol.ShardStatus(shard=shard.shard_id, state="running")]
    reply_of(heartbeat(client, tokens[shard.node_id], protocol.Heartbeat(shards=running)))
    assert Replica.objects.get().state == ReplicaState.RUNNING
    return tokens, shard.node_id, "big-r1"


def no_gpus(node_id: str) -> protocol.Inventory:
    return make_inventory(f"{node_id}.example", gpus=0)


def rebuilt_elsewhere(holder: str, old_replica: str) -> None:
    old = Replica.objects.get(replica_id=old_replica)
    assert old.state == ReplicaState.FAILED
    assert f"of {holder} left its node's inventory" in old.reason
    assert not GPUClaim.objects.filter(node_id=holder).exists(), "claims on GPUs the node no longer has"
    assert reconcile().placed == ["big-r2"]
    (new_shard,) = Shard.objects.filter(replica__replica_id="big-r2")
    assert new_shard.node_id != holder and len(new_shard.gpu_indices) == 8


def test_a_heartbeat_inventory_without_the_gpus_fails_the_replica_and_placement_rebuilds_it(client, eight_gpu_replica):
    tokens, holder, replica = eight_gpu_replica
    beat = protocol.Heartbeat(inventory=no_gpus(holder), inventory_hash="no-gpus")

    reply = reply_of(heartbeat(client, tokens[holder], beat))

    assert reply.shards == [], "the node is still told to run a replica on GPUs it does not have"
    rebuilt_elsewhere(holder, replica)


def test_re_registering_without_the_gpus_does_the_same(client, eight_gpu_replica):
    _tokens, holder, replica = eight_gpu_replica
    message = protocol.Register(node_id=holder, inventory=no_gpus(holder), inventory_hash="no-gpus")
    assert post(client, "/api/v1/register", message, JOIN_TOKEN).status_code == 200

    rebuilt_elsewhere(holder, replica)


def test_gpus_that_come_back_come_back_free(client, eight_gpu_replica):
    tokens, holder, _ = eight_gpu_replica
    reply_of(heartbeat(client, tokens[holder], protocol.Heartbeat(inventory=no_gpus(holder), inventory_hash="0")))
    reconcile()
    back = make_inventory(f"{holder}.example", gpus=8)
    reply_of(heartbeat(client, tokens[holder], protocol.Heartbeat(inventory=back, inventory_hash="8")))

    assert GPU.objects.filter(node_id=holder).free().count() == 8
    assert reply_of(heartbeat(client, tokens[holder], protocol.Heartbeat())).shards == []


def test_another_card_at_the_same_index_is_a_gpu_gone(client, eight_gpu_replica):
    tokens, holder, replica = eight_gpu_replica
    swapped = make_inventory(f"{holder}.example", gpus=8)
    swapped.gpus[5].uuid = "GPU-a-new-card"
    reply_of(heartbeat(client, tokens[holder], protocol.Heartbeat(inventory=swapped, inventory_hash="swapped")))

    old = Replica.objects.get(replica_id=replica)
    assert old.state == ReplicaState.FAILED and f"GPU 5 of {holder} left" in old.reason
    assert not GPUClaim.objects.exists()
    # The new card is healthy: the node may take the rebuilt replica again.
    assert reconcile().placed == ["big-r2"]


def test_an_unchanged_inventory_keeps_the_replica(client, eight_gpu_replica):
    tokens, holder, _ = eight_gpu_replica
    same = make_inventory(f"{holder}.example", gpus=8)
    running = [protocol.ShardStatus(shard=Shard.objects.get().shard_id, state="running")]
    beat = protocol.Heartbeat(inventory=same, inventory_hash="same", shards=running)
    assert len(reply_of(heartbeat(client, tokens[holder], beat)).shards) == 1

    assert Replica.objects.get().state == ReplicaState.RUNNING
    assert GPUClaim.objects.filter(node_id=holder).count() == 8


def test_the_reconciler_catches_a_claim_written_as_its_gpu_went(client, eight_gpu_replica):
    """A placement pass that read the fleet just before a registration removed the GPU writes its claim anyway."""
    _, holder, replica = eight_gpu_replica
    GPU.objects.filter(node_id=holder, index=7).delete()  # as the registration committed beside the placement

    result = reconcile()

    assert replica in result.failed
    assert "GPU 7 of" in Replica.objects.get(replica_id=replica).reason
    assert not GPUClaim.objects.filter(node_id=holder).exists()


def test_the_reconciler_catches_a_claim_on_a_failed_gpu(client, eight_gpu_replica):
    _, holder, replica = eight_gpu_replica
    GPU.objects.filter(node_id=holder, index=2).update(condition=GPUCondition.FAILED)  # beside the placement

    assert replica in reconcile().failed
    assert Replica.objects.get(replica_id=replica).reason == f"GPU 2 of {holder} failed"
