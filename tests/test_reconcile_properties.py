"""The reconciler over random fleets in the database (hypothesis): what it stores always keeps the rules."""

from __future__ import annotations

from collections import Counter, defaultdict

from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.django import TestCase

from agent import protocol
from inventory.desired import orders
from inventory.liveness import mark_stale
from inventory.models import (
    GPU,
    RUN_STATES,
    AdminState,
    Allocation,
    FabricAttachment,
    GPUClaim,
    Liveness,
    Node,
    Replica,
    ReplicaState,
    Shard,
)
from inventory.reconcile import reconcile
from inventory.registration import upsert_inventory
from livestate import shardlists
from tests.factories import STATE_MIX, deployment, make_inventory, node

GPU_NAMES = {"NVIDIA H100 80GB HBM3": "H100-80GB", "NVIDIA A100-SXM4-40GB": "A100-40GB"}

fleet_specs = st.lists(
    st.fixed_dictionaries(
        {
            "gpus": st.integers(0, 8),
            "gpu_name": st.sampled_from(sorted(GPU_NAMES)),
            "memory_gb": st.sampled_from([64, 256, 1024]),
            "fabrics": st.lists(st.sampled_from(["ib-a", "ib-b"]), unique=True, max_size=2),
            "state": st.sampled_from(STATE_MIX),
        }
    ),
    min_size=1,
    max_size=6,
)
deployment_specs = st.lists(
    st.fixed_dictionaries(
        {
            "replicas": st.integers(0, 4),
            "shards_per_replica": st.integers(1, 3),
            "gpus_per_shard": st.integers(0, 8),
            "gpu_class": st.sampled_from(["", *GPU_NAMES.values()]),
            "memory_gb_per_shard": st.sampled_from([0, 48, 200]),
        }
    ),
    min_size=1,
    max_size=3,
)
# Later changes: (node index, new admin state and liveness).
changes = st.lists(st.tuples(st.integers(0, 5), st.sampled_from(STATE_MIX)), max_size=4)
# Later inventories: (node index, how many of its GPUs it still reports), as an agent whose GPUs vanished.
drops = st.lists(st.tuples(st.integers(0, 5), st.integers(0, 7)), max_size=3)


def check_invariants(placed_now: list[str], schedulable: set[str]) -> None:
    gpus = {(g.node_id, g.index): g for g in GPU.objects.all()}
    adapters = {(f.node_id, f.fabric): f.hcas for f in FabricAttachment.objects.all()}
    claims = Counter(GPUClaim.objects.values_list("node_id", "gpu_index"))
    assert all(n == 1 for n in claims.values()), "a GPU in two allocations"
    assert set(claims) <= set(gpus), "a claim on a GPU its node no longer reports"
    memory: defaultdict[str, int] = defaultdict(int)
    for allocation in Allocation.objects.all():
        memory[allocation.node_id] += allocation.memory_gb
    for node_row in Node.objects.all():
        if memory[node_row.pk]:
            total_gb = node_row.memory_total_bytes / 2**30
            assert memory[node_row.pk] <= total_gb, f"{node_row.pk}: memory claimed above its total"
    shard_ids = set(
        Shard.objects.filter(state__in=(*RUN_STATES, ReplicaState.RELEASING)).values_list("shard_id", flat=True)
    )
    assert set(Allocation.objects.values_list("shard_id", flat=True)) <= shard_ids, "an allocation nothing holds"
    for replica in Replica.objects.select_related("deployment").prefetch_related("shards"):
        d, shards = replica.deployment, list(replica.shards.all())
        if replica.state == ReplicaState.PENDING:
            assert not shards and not Allocation.objects.filter(replica_id=replica.replica_id).exists()
            continue
        if replica.state not in RUN_STATES:
            continue
        assert len(shards) == d.shards_per_replica, "a replica placed in part"
        nodes = {s.node_id for s in shards}
        for shard in shards:
            allocation = Allocation.objects.get(shard_id=shard.shard_id)
            assert allocation.node_id == shard.node_id
            assert len(shard.gpu_indices) == d.gpus_per_shard
            assert sorted(allocation.gpu_indices) == sorted(shard.gpu_indices)
            for index in shard.gpu_indices:
                gpu = gpus[(shard.node_id, index)]
                assert gpu.healthy and (not d.gpu_class or gpu.gpu_class == d.gpu_class)
            if len(nodes) > 1:
                assert shard.hcas == adapters[(shard.node_id, replica.fabric)], "adapters of another fabric"
            else:
                assert not replica.fabric and not shard.hcas
        if replica.replica_id in placed_now:
            assert nodes <= schedulable, f"{replica} placed on a node that was not schedulable"


class ReconcileProperties(TestCase):
    @settings(max_examples=25, deadline=None)
    @given(fleet=fleet_specs, wanted=deployment_specs, later=changes, dropped=drops)
    def test_stored_placements_keep_the_rules_through_changes(self, fleet, wanted, later, dropped):
        shardlists.forget()
        names = []
        for i, spec in enumerate(fleet):
            admin_state, liveness = spec.pop("state")
            spec["fabrics"] = {f: [f"{f}-n{i}"] for f in spec["fabrics"]}
            node(f"n{i}", **spec, admin_state=admin_state, liveness=liveness)
            names.append(f"n{i}")
        for i, spec in enumerate(wanted):
            if not spec["gpus_per_shard"]:
                spec["gpu_class"] = ""
            deployment(f"d{i}", **spec)

        def schedulable() -> set[str]:
            return set(
                Node.objects.filter(admin_state=AdminState.ACTIVE, liveness=Liveness.ALIVE).values_list("pk", flat=True)
            )

        check_invariants(reconcile().placed, schedulable())
        # Agents report fewer GPUs: registration alone must leave no replica on the missing ones.
        for index, keep in dropped:
            if index < len(names) and keep < fleet[index]["gpus"]:
                fleet[index]["gpus"] = keep
                spec = fleet[index]
                inventory = make_inventory(
                    f"{names[index]}.example",
                    gpus=keep,
                    gpu_name=spec["gpu_name"],
                    memory_total_bytes=spec["memory_gb"] * 2**30,
                    fabrics=[protocol.Fabric(name=f, hcas=h) for f, h in spec["fabrics"].items()],
                )
                upsert_inventory(names[index], inventory)
        check_invariants([], schedulable())
        for index, (admin_state, liveness) in later:
            if index < len(names):
                Node.objects.filter(pk=names[index]).update(admin_state=admin_state, liveness=liveness)
        mark_stale()
        # Agents on live nodes run what they are told.
        for name in Node.objects.filter(liveness=Liveness.ALIVE).values_list("pk", flat=True):
            wanted_here = orders(name).shards
            orders(name, [protocol.ShardStatus(shard=s.shard, state="running") for s in wanted_here])
        for _ in range(2):
            check_invariants(reconcile().placed, schedulable())
        # Idempotent: once settled, another pass places and releases nothing.
        again = reconcile()
        assert not again.placed and not again.releasing and not again.created
