"""The inventory's operations, each on its own."""

from datetime import timedelta

import pytest
from django.db import IntegrityError, transaction
from django.utils import timezone
from inventory.allocations import allocate, cluster_fabrics, release_replica, release_shard

from agent import protocol
from inventory.liveness import touch
from inventory.models import GPU, AdminState, Allocation, Liveness, Node, NodeState, derive_state, gpu_class
from inventory.registration import upsert_inventory
from tests.factories import make_inventory

pytestmark = pytest.mark.django_db


def register(node_id="n1", **kwargs):
    node, _ = upsert_inventory(node_id, make_inventory(f"{node_id}.example", **kwargs))
    return node


@pytest.mark.parametrize(
    ("name", "memory_gib", "expected"),
    [
        ("NVIDIA H100 80GB HBM3", 80, "H100-80GB"),
        ("NVIDIA A100-SXM4-40GB", 40, "A100-40GB"),
        ("NVIDIA A100-SXM4-80GB", 80, "A100-80GB"),
        ("NVIDIA L40S", 45, "L40S-45GB"),
        ("NVIDIA GeForce RTX 4090", 24, "RTX4090-24GB"),
        ("Tesla T4", 15, "T4-15GB"),
    ],
)
def test_gpu_class_is_model_and_memory(name, memory_gib, expected):
    assert gpu_class(name, memory_gib * 2**30) == expected


@pytest.mark.parametrize(
    ("admin_state", "liveness", "shown"),
    [
        (AdminState.ACTIVE, Liveness.ALIVE, NodeState.READY),
        (AdminState.CORDONED, Liveness.ALIVE, NodeState.CORDONED),
        (AdminState.DRAINING, Liveness.ALIVE, NodeState.DRAINING),
        (AdminState.CORDONED, Liveness.UNREACHABLE, NodeState.UNREACHABLE),
        (AdminState.DRAINING, Liveness.LOST, NodeState.LOST),
        (AdminState.ACTIVE, Liveness.LOST, NodeState.LOST),
    ],
)
def test_displayed_state_is_derived_with_liveness_first(admin_state, liveness, shown):
    assert derive_state(admin_state, liveness) == shown
    node = Node(id="x", admin_state=admin_state, liveness=liveness)
    assert node.state == shown
    assert node.schedulable == (shown == NodeState.READY)


def test_upsert_creates_a_node_with_its_hardware():
    inventory = make_inventory(
        "gpu-1.example",
        gpus=2,
        filesystems=[protocol.Filesystem(mount="/models", fstype="ext4", total_bytes=100, free_bytes=40)],
        weights=[protocol.Weights(path="/models/llama", size_bytes=10, format="safetensors")],
        weights_scanned=True,
        fabrics=[protocol.Fabric(name="ib-a", hcas=["mlx5_0", "mlx5_1"], rate_gbps=400)],
        provision=[protocol.EngineInstall(engine="vllm", version="0.9.1", state="ready")],
        labels={"rack": "r1"},
    )
    node, created = upsert_inventory("gpu-1", inventory, inventory_hash="h1")
    assert created
    node = Node.objects.get(pk="gpu-1")
    assert node.hostname == "gpu-1.example"
    assert node.labels == {"rack": "r1"}
    assert node.inventory_hash == "h1"
    assert [g.gpu_class for g in node.gpus.all()] == ["H100-80GB", "H100-80GB"]
    assert node.filesystems.get().mount == "/models"
    assert node.weights.get().path == "/models/llama"
    assert node.fabrics.get().hcas == ["mlx5_0", "mlx5_1"]
    assert node.engine_installs.get().version == "0.9.1"
    assert node.cpus == inventory.host.cpus


def test_upsert_replaces_hardware_and_keeps_operator_intent(operator):
    node = register("n1", gpus=4)
    Node.objects.filter(pk="n1").update(admin_state=AdminState.DRAINING, notes="bad fan", operator_labels={"a": "b"})
    upsert_inventory("n1", make_inventory("renamed.example", gpus=2))
    node = Node.objects.get(pk="n1")
    assert node.admin_state == AdminState.DRAINING
    assert node.notes == "bad fan"
    assert node.operator_labels == {"a": "b"}
    assert node.hostname == "renamed.example"
    assert node.gpus.count() == 2


def test_upsert_with_duplicate_indices_keeps_one_row_each():
    inventory = make_inventory("dup.example", gpus=0)
    inventory.gpus = [protocol.GPU(index=0, name="NVIDIA H100 80GB"), protocol.GPU(index=0, name="NVIDIA L4")]
    upsert_inventory("dup", inventory)
    assert GPU.objects.filter(node_id="dup").count() == 1


def test_touch_revives_an_unreachable_node_without_touching_its_cordon():
    node = register("n1")
    Node.objects.filter(pk="n1").update(admin_state=AdminState.CORDONED, liveness=Liveness.UNREACHABLE)
    node.refresh_from_db()
    now = timezone.now()
    touch(node, now)
    node.refresh_from_db()
    assert node.liveness == Liveness.ALIVE
    assert node.admin_state == AdminState.CORDONED
    assert node.last_heartbeat == now
    assert node.state == NodeState.CORDONED
    event = node.events.get(kind="liveness")
    assert (event.from_state, event.to_state) == (Liveness.UNREACHABLE, Liveness.ALIVE)


def test_free_gpus_excludes_allocated_and_unhealthy():
    node = register("n1", gpus=4)
    GPU.objects.filter(node=node, index=3).update(health="2 uncorrectable ECC errors")
    allocate(node, "s1", "r1", [0], memory_gb=0)
    node = Node.objects.get(pk="n1")
    assert node.free_gpus() == [1, 2]


def test_a_gpu_cannot_be_in_two_allocations_on_one_node():
    node = register("n1", gpus=2)
    allocate(node, "s1", "r1", [0])
    with pytest.raises(IntegrityError), transaction.atomic():
        allocate(node, "s2", "r2", [0])


def test_a_shard_is_allocated_once():
    node = register("n1", gpus=2)
    allocate(node, "s1", "r1", [0])
    with pytest.raises(IntegrityError), transaction.atomic():
        allocate(node, "s1", "r1", [1])


def test_gpu_index_is_unique_per_node():
    node = register("n1", gpus=1)
    with pytest.raises(IntegrityError), transaction.atomic():
        GPU.objects.create(node=node, index=0, name="NVIDIA H100 80GB")


def test_free_memory_counts_claims():
    node = register("n1", memory_total_bytes=64 * 2**30)
    allocate(node, "s1", "r1", [], memory_gb=40)
    allocate(node, "s2", "r2", [], memory_gb=0)  # declared nothing, so claims nothing
    node = Node.objects.get(pk="n1")
    assert node.free_memory_gb() == pytest.approx(24.0)


def test_free_memory_of_a_node_that_never_said_is_unconstrained():
    node = register("n1", memory_total_bytes=0)
    allocate(node, "s1", "r1", [], memory_gb=40)
    assert Node.objects.get(pk="n1").free_memory_gb() is None


def test_local_disk_leaves_shared_filesystems_out():
    register(
        "n1",
        filesystems=[
            protocol.Filesystem(mount="/local", fstype="xfs", total_bytes=1000, free_bytes=300),
            protocol.Filesystem(mount="/scratch", fstype="ext4", total_bytes=500, free_bytes=100),
            protocol.Filesystem(mount="/filer", fstype="nfs4", total_bytes=10**6, free_bytes=10**5, shared=True),
        ],
    )
    assert Node.objects.get(pk="n1").local_disk() == (400, 1500)


def test_local_disk_with_nothing_reported_is_unknown_not_full():
    register("n1")
    assert Node.objects.get(pk="n1").local_disk() is None


def test_local_disk_on_shared_storage_only_is_none_to_spend():
    register("n1", filesystems=[protocol.Filesystem(mount="/filer", fstype="lustre", total_bytes=9, shared=True)])
    assert Node.objects.get(pk="n1").local_disk() == (0, 0)


def test_has_weights_is_an_exact_path_match():
    register("n1", weights=[protocol.Weights(path="/models/llama-3-8b")], weights_scanned=True)
    node = Node.objects.get(pk="n1")
    assert node.has_weights("/models/llama-3-8b")
    assert not node.has_weights("/models/llama-3")
    assert not node.has_weights("meta-llama/Llama-3-8B")


def test_knows_its_weights_only_when_it_looked():
    register("looked-none", weights_scanned=True)
    register("never-looked")
    assert Node.objects.get(pk="looked-none").knows_its_weights()
    assert not Node.objects.get(pk="never-looked").knows_its_weights()


def test_adapters_for_a_fabric_are_only_that_fabrics():
    register(
        "n1",
        fabrics=[
            protocol.Fabric(name="ib-a", hcas=["mlx5_0", "mlx5_1"], rate_gbps=400),
            protocol.Fabric(name="ib-b", hcas=["mlx5_2"], rate_gbps=200),
        ],
    )
    node = Node.objects.get(pk="n1")
    assert node.adapters_for("ib-a") == ["mlx5_0", "mlx5_1"]
    assert node.adapters_for("ib-b") == ["mlx5_2"]
    assert node.adapters_for("ib-c") == []
    assert node.fabric_names() == ["ib-a", "ib-b"]


def test_cluster_fabrics_are_every_fabric_once_sorted():
    register("n1", fabrics=[protocol.Fabric(name="ib-b"), protocol.Fabric(name="ib-a")])
    register("n2", fabrics=[protocol.Fabric(name="ib-a")])
    register("n3")
    assert cluster_fabrics() == ["ib-a", "ib-b"]


def test_gpus_by_class_groups_them():
    node = register("n1", gpus=2)
    GPU.objects.create(node=node, index=5, name="NVIDIA L4", memory_bytes=24 * 2**30)
    grouped = Node.objects.get(pk="n1").gpus_by_class()
    assert {cls: [g.index for g in gpus] for cls, gpus in grouped.items()} == {"H100-80GB": [0, 1], "L4-24GB": [5]}


def test_release_shard_frees_only_that_shard():
    node = register("n1", gpus=4)
    allocate(node, "s1", "r1", [0, 1])
    allocate(node, "s2", "r2", [2])
    assert release_shard("s1") == 1
    assert release_shard("s1") == 0
    assert Node.objects.get(pk="n1").free_gpus() == [0, 1, 3]


def test_release_replica_frees_every_shard_on_every_node():
    first, second = register("n1", gpus=2), register("n2", gpus=2)
    allocate(first, "r1-s0", "r1", [0, 1])
    allocate(second, "r1-s1", "r1", [0])
    allocate(second, "r2-s0", "r2", [1])
    assert release_replica("r1") == 2
    assert list(Allocation.objects.values_list("shard_id", flat=True)) == ["r2-s0"]


def test_capacity_questions_ask_nothing_more_once_prefetched(django_assert_num_queries):
    register("n1", gpus=8, filesystems=[protocol.Filesystem(mount="/m", total_bytes=10, free_bytes=5)])
    related = ("gpus", "gpu_claims", "allocations", "filesystems", "weights", "fabrics")
    node = Node.objects.prefetch_related(*related).get(pk="n1")
    with django_assert_num_queries(0):
        node.free_gpus(), node.free_memory_gb(), node.local_disk(), node.has_weights("/m/x")
        node.adapters_for("ib"), node.gpus_by_class()


def test_registration_sets_first_heartbeat_on_the_control_plane_clock():
    before = timezone.now()
    node = register("n1")
    assert before <= node.last_heartbeat <= timezone.now() + timedelta(seconds=1)
