"""Placement over random fleets (hypothesis), in memory: the rules hold for every fleet and profile."""

from __future__ import annotations

import copy
from collections import Counter

from hypothesis import given, settings
from hypothesis import strategies as st

from inventory.models import NodeState
from inventory.placement import CannotPlace, Fleet, NodeView, Placement, Planner, Profile

CLASSES = ["H100-80GB", "A100-40GB"]
FABRICS = ["ib-a", "ib-b"]


@st.composite
def node_views(draw, name: str) -> NodeView:
    gpus = draw(st.lists(st.tuples(st.sampled_from(CLASSES), st.booleans(), st.booleans()), max_size=8))
    free: dict[str, list[int]] = {}
    count: Counter = Counter()
    for index, (gpu_class, healthy, claimed) in enumerate(gpus):
        count[gpu_class] += 1
        if healthy and not claimed:
            free.setdefault(gpu_class, []).append(index)
    memory = draw(st.none() | st.integers(16, 512))
    cpus = draw(st.sampled_from([0, 8, 64]))
    fabrics = draw(st.lists(st.sampled_from(FABRICS), unique=True, max_size=2))
    scanned = draw(st.booleans())
    return NodeView(
        id=name,
        state=draw(st.sampled_from(list(NodeState)) | st.just(NodeState.READY)),
        memory_total_gb=memory,
        memory_claimed_gb=draw(st.integers(0, memory)) if memory else draw(st.integers(0, 64)),
        cpus=cpus,
        cores_claimed=draw(st.integers(0, cpus)),
        free_gpus=free,
        gpu_count=count,
        fabrics={fabric: [f"{fabric}-{name}-{k}" for k in range(2)] for fabric in fabrics},
        weights_scanned=scanned,
        weights={"/m/a"} if scanned and draw(st.booleans()) else set(),
        ports=set(draw(st.lists(st.integers(20000, 20003), max_size=3))),
    )


@st.composite
def fleets(draw) -> list[NodeView]:
    size = draw(st.integers(1, 10))
    return [draw(node_views(f"n{i:02d}")) for i in range(size)]


profiles = st.builds(
    Profile,
    shards=st.integers(1, 4),
    gpus=st.integers(0, 4),
    gpu_class=st.sampled_from(["", *CLASSES]),
    memory_gb=st.sampled_from([0, 8, 64, 200]),
    cpu_cores=st.sampled_from([0, 4, 32]),
    weights_path=st.sampled_from(["", "/m/a"]),
).map(lambda p: p if p.gpus else Profile(p.shards, 0, "", p.memory_gb, p.cpu_cores, p.weights_path))


def fits(node: NodeView, profile: Profile) -> int:
    """How many shards a node can hold, worked out independently of the code under test."""
    if node.state != NodeState.READY:
        return 0
    if profile.weights_path and node.weights_scanned and profile.weights_path not in node.weights:
        return 0
    counts = [profile.shards]
    if profile.gpus:
        free = sum(len(v) for k, v in node.free_gpus.items() if not profile.gpu_class or k == profile.gpu_class)
        counts.append(free // profile.gpus)
    if profile.memory_gb and node.memory_total_gb is not None:
        counts.append(int((node.memory_total_gb - node.memory_claimed_gb) // profile.memory_gb))
    if profile.cpu_cores and node.cpus:
        counts.append((node.cpus - node.cores_claimed) // profile.cpu_cores)
    return max(min(counts), 0)


def placeable(fleet: Fleet, profile: Profile) -> bool:
    if any(fits(node, profile) >= profile.shards for node in fleet.nodes.values()):
        return True
    if profile.shards < 2:
        return False
    per_fabric: Counter = Counter()
    for node in fleet.nodes.values():
        for fabric in node.fabrics:
            per_fabric[fabric] += fits(node, profile)
    return any(total >= profile.shards for total in per_fabric.values())


def check(placement: Placement, before: Fleet, profile: Profile) -> None:
    """One placement against the fleet as it was just before it."""
    assert sorted(s.index for s in placement.shards) == list(range(profile.shards)), "whole, each shard once"
    per_node: dict[str, list] = {}
    for shard in placement.shards:
        per_node.setdefault(shard.node_id, []).append(shard)
    for node_id, shards in per_node.items():
        node = before.nodes[node_id]
        assert node.state == NodeState.READY, f"placed on a {node.state} node"
        assert node.has_weights(profile.weights_path)
        gpus = [g for s in shards for g in s.gpus]
        assert len(gpus) == len(set(gpus)) == profile.gpus * len(shards), "a GPU twice, or the wrong count"
        allowed = {g for k, v in node.free_gpus.items() if not profile.gpu_class or k == profile.gpu_class for g in v}
        assert set(gpus) <= allowed, "a GPU not free, unhealthy or of another class"
        if node.memory_total_gb is not None:
            assert node.memory_claimed_gb + profile.memory_gb * len(shards) <= node.memory_total_gb or (
                profile.memory_gb == 0
            )
        if node.cpus and profile.cpu_cores:
            assert node.cores_claimed + profile.cpu_cores * len(shards) <= node.cpus
        ports = [s.port for s in shards]
        assert len(set(ports)) == len(ports) and not set(ports) & node.ports, "port clash"
    if len(per_node) > 1:
        assert placement.fabric, "a multi-node replica without a fabric"
        for node_id, shards in per_node.items():
            assert placement.fabric in before.nodes[node_id].fabrics
            for shard in shards:
                assert shard.hcas == before.nodes[node_id].fabrics[placement.fabric], "adapters of another fabric"
    else:
        assert not placement.fabric and all(not s.hcas for s in placement.shards)


@settings(max_examples=300, deadline=None)
@given(fleet_nodes=fleets(), profile=profiles, replicas=st.integers(1, 5))
def test_every_placement_keeps_the_rules_and_fails_only_when_nothing_fits(fleet_nodes, profile, replicas):
    fleet = Fleet(copy.deepcopy(fleet_nodes))
    planner = Planner(fleet, profile)
    for _ in range(replicas):
        before = copy.deepcopy(fleet)
        spread = Counter(planner.spread)
        outcome = planner.place()
        if isinstance(outcome, CannotPlace):
            assert not placeable(before, profile), "refused although the replica fits"
            assert outcome.reason.startswith(f"needs {profile.describe()}")
            continue
        check(outcome, before, profile)
        singles = [n for n in before.nodes.values() if fits(n, profile) >= profile.shards]
        if len(outcome.node_ids) == 1 and any(spread[n.id] == 0 for n in singles):
            assert spread[outcome.node_ids[0]] == 0, "stacked while a node without this deployment had room"


@st.composite
def small_nodes_on_fabrics(draw) -> list[NodeView]:
    """Ready nodes too small for a whole replica, on one or two fabrics: multi-node or nothing."""
    nodes = []
    for i in range(draw(st.integers(2, 8))):
        fabrics = draw(st.lists(st.sampled_from(FABRICS), unique=True, min_size=0, max_size=2))
        nodes.append(
            NodeView(
                id=f"n{i}",
                state=NodeState.READY,
                free_gpus={"H100-80GB": list(range(draw(st.integers(1, 4))))},
                gpu_count=Counter({"H100-80GB": 4}),
                fabrics={f: [f"{f}-n{i}-{k}" for k in range(2)] for f in fabrics},
            )
        )
    return nodes


@settings(max_examples=150, deadline=None)
@given(fleet_nodes=small_nodes_on_fabrics(), shards=st.integers(2, 4), replicas=st.integers(1, 3))
def test_multi_node_replicas_stay_on_one_fabric_with_its_adapters_only(fleet_nodes, shards, replicas):
    profile = Profile(shards=shards, gpus=4, gpu_class="H100-80GB")
    fleet = Fleet(fleet_nodes)
    planner = Planner(fleet, profile)
    for _ in range(replicas):
        before = copy.deepcopy(fleet)
        outcome = planner.place()
        if isinstance(outcome, CannotPlace):
            assert not placeable(before, profile)
        else:
            check(outcome, before, profile)


@settings(max_examples=100, deadline=None)
@given(fleet_nodes=fleets(), profile=profiles)
def test_the_same_fleet_gives_the_same_answer(fleet_nodes, profile):
    first = Planner(Fleet(copy.deepcopy(fleet_nodes)), profile)
    second = Planner(Fleet(copy.deepcopy(list(reversed(fleet_nodes)))), profile)
    for _ in range(3):
        assert first.place() == second.place()


def test_reason_names_the_state_and_free_gpus_of_the_nodes_that_have_the_class():
    def h100(name, state, free):
        return NodeView(
            id=name, state=state, free_gpus={"H100-80GB": list(range(free))}, gpu_count=Counter({"H100-80GB": 8})
        )

    fleet = Fleet(
        [
            h100("a", NodeState.CORDONED, 8),
            h100("b", NodeState.CORDONED, 8),
            h100("c", NodeState.READY, 1),
            NodeView(id="d", state=NodeState.READY, free_gpus={"A100-40GB": [0, 1]}, gpu_count=Counter(A100=2)),
        ]
    )
    outcome = Planner(fleet, Profile(gpus=2, gpu_class="H100-80GB")).place()
    assert outcome == CannotPlace("needs 2 × H100-80GB on one node: 3 nodes have H100-80GB, 2 cordoned, 1 has 1 free")


def test_reason_for_a_multi_node_replica_says_what_each_fabric_offers():
    nodes = [
        NodeView(id="a", state=NodeState.READY, free_gpus={"H100-80GB": list(range(8))}, fabrics={"ib": ["m0"]}),
        NodeView(id="b", state=NodeState.READY, free_gpus={"H100-80GB": list(range(8))}),
    ]
    for node in nodes:
        node.gpu_count["H100-80GB"] = 8
    outcome = Planner(Fleet(nodes), Profile(shards=2, gpus=8, gpu_class="H100-80GB")).place()
    assert isinstance(outcome, CannotPlace)
    assert outcome.reason.endswith(
        "across nodes of one fabric: room for ib 1 of 2 shards (1 node with room has no fabric)"
    )


def test_missing_weights_and_memory_are_named():
    nodes = [
        NodeView(id="a", state=NodeState.READY, weights_scanned=True),
        NodeView(id="b", state=NodeState.READY, memory_total_gb=64, memory_claimed_gb=60),
    ]
    outcome = Planner(Fleet(nodes), Profile(memory_gb=32, weights_path="/models/x")).place()
    assert outcome == CannotPlace(
        "needs 32 GB memory on one node: 2 nodes, 1 lacks /models/x, 1 has 4 GB memory unclaimed"
    )
