"""The inventory's operations, each on its own."""

from datetime import timedelta

import pytest
from django.db import IntegrityError, transaction
from django.utils import timezone

from agent import protocol
from inventory.fleet import Placement, ShardPlacement, load_fleet
from inventory.liveness import touch
from inventory.models import (
    AGENT_FIELDS,
    GPU,
    AdminState,
    Allocation,
    GPUClaim,
    Liveness,
    Node,
    NodeState,
    derive_state,
    gpu_class,
)
from inventory.reconcile import record_placements
from inventory.registration import upsert_inventory
from inventory.replicas import begin_release, fail_replicas, finish_release
from tests.factories import make_inventory, place

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


def view(node_id: str, weights_paths: tuple[str, ...] = ()):
    """What placement reads of one node, by its own loader."""
    return load_fleet(weights_paths).nodes[node_id]


def test_a_free_gpu_is_healthy_and_unclaimed():
    register("n1", gpus=4)
    GPU.objects.filter(node_id="n1", index=3).update(health="2 uncorrectable ECC errors")
    place("a", {"n1": [0]})
    assert sorted(GPU.objects.free().values_list("index", flat=True)) == [1, 2]
    assert view("n1").free_gpus == {"H100-80GB": [1, 2]}


def test_a_gpu_cannot_be_in_two_allocations_on_one_node():
    register("n1", gpus=2)
    place("a", {"n1": [0]})
    with pytest.raises(IntegrityError), transaction.atomic():
        place("b", {"n1": [0]})


def test_a_replica_is_placed_once():
    register("n1", gpus=2)
    replica = place("a", {"n1": [0]})
    again = Placement([ShardPlacement(0, "n1", [1], [], 20001)])
    with pytest.raises(RuntimeError, match="placed by another pass"), transaction.atomic():
        record_placements([(replica, again)], timezone.now())
    assert list(GPUClaim.objects.values_list("gpu_index", flat=True)) == [0]


def test_gpu_index_is_unique_per_node():
    node = register("n1", gpus=1)
    with pytest.raises(IntegrityError), transaction.atomic():
        GPU.objects.create(node=node, index=0, name="NVIDIA H100 80GB")


def test_free_memory_counts_claims():
    register("n1", memory_total_bytes=64 * 2**30)
    place("a", {"n1": []}, memory_gb=40)
    place("b", {"n1": []}, memory_gb=0)  # declared nothing, so claims nothing
    assert view("n1").memory_free_gb() == pytest.approx(24.0)


def test_free_memory_of_a_node_that_never_said_is_unconstrained():
    register("n1", memory_total_bytes=0)
    place("a", {"n1": []}, memory_gb=40)
    assert view("n1").memory_free_gb() is None


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
    node = view("n1", ("/models/llama-3-8b", "/models/llama-3"))
    assert node.has_weights("/models/llama-3-8b")
    assert not node.has_weights("/models/llama-3")


def test_a_node_that_never_looked_for_weights_is_not_ruled_out():
    register("looked-none", weights_scanned=True)
    register("never-looked")
    assert not view("looked-none", ("/m/x",)).has_weights("/m/x")
    assert view("never-looked", ("/m/x",)).has_weights("/m/x")


def test_adapters_are_kept_per_fabric():
    register(
        "n1",
        fabrics=[
            protocol.Fabric(name="ib-a", hcas=["mlx5_0", "mlx5_1"], rate_gbps=400),
            protocol.Fabric(name="ib-b", hcas=["mlx5_2"], rate_gbps=200),
        ],
    )
    assert view("n1").fabrics == {"ib-a": ["mlx5_0", "mlx5_1"], "ib-b": ["mlx5_2"]}


def test_gpus_are_counted_by_class():
    node = register("n1", gpus=2)
    GPU.objects.create(node=node, index=5, name="NVIDIA L4", memory_bytes=24 * 2**30)
    assert view("n1").gpu_count == {"H100-80GB": 2, "L4-24GB": 1}


def test_a_finished_release_frees_only_that_shard():
    register("n1", gpus=4)
    first, _ = place("a", {"n1": [0, 1]}), place("b", {"n1": [2]})
    begin_release([first], "scaled down", timezone.now())
    assert finish_release(["a-r1-s0"]) == ["a-r1-s0"]
    assert sorted(GPU.objects.free().values_list("index", flat=True)) == [0, 1, 3]
    assert list(Allocation.objects.values_list("shard_id", flat=True)) == ["b-r1-s0"]


def test_a_failed_replica_frees_every_shard_on_every_node():
    register("n1", gpus=2), register("n2", gpus=2)
    place("a", {"n1": [0, 1], "n2": [0]})
    place("b", {"n2": [1]})
    assert fail_replicas(["a-r1"], "test") == ["a-r1"]
    assert list(Allocation.objects.values_list("shard_id", flat=True)) == ["b-r1-s0"]


def test_registration_sets_first_heartbeat_on_the_control_plane_clock():
    before = timezone.now()
    node = register("n1")
    assert before <= node.last_heartbeat <= timezone.now() + timedelta(seconds=1)


def test_a_report_replaces_exactly_the_agent_fields():
    first = make_inventory("a.example", mgmt_addr="10.0.0.1", labels={"rack": "1"}, engine_versions={"vllm": "1"})
    upsert_inventory("n1", first, inventory_hash="h1", boot_id="run-1", seq=7)
    Node.objects.filter(pk="n1").update(notes="rack 4", operator_labels={"team": "infra"})
    operator_side = {f.name for f in Node._meta.concrete_fields} - {"id", *AGENT_FIELDS}
    before = Node.objects.values(*operator_side).get(pk="n1")
    second = protocol.Inventory(
        hostname="b.example",
        mgmt_addr="10.0.0.2",
        labels={"rack": "2"},
        memory_total_bytes=2**40,
        host=protocol.Host(os="Rocky", os_version="9", kernel="5.14", arch="aarch64", cpu_model="Grace", cpus=72),
        agent_version="0.2.0",
        engine_versions={"vllm": "2"},
        engines_probed=True,
        weights_scanned=True,
    )
    was = Node.objects.values(*AGENT_FIELDS).get(pk="n1")
    upsert_inventory("n1", second, inventory_hash="h2", boot_id="run-2", seq=1)
    now = Node.objects.values(*AGENT_FIELDS).get(pk="n1")
    assert [field for field in AGENT_FIELDS if now[field] == was[field]] == [], "every agent field is replaced"
    assert Node.objects.values(*operator_side).get(pk="n1") == before, "no other field is touched"
