"""The rules in their one home agree with what placement, the pages, the admin and /metrics show.

A fleet of 50 nodes is generated from a seed and built the way production
builds one: every node registers through `upsert_inventory` (some with GPUs
NVML calls unhealthy), a reconcile pass places deployments on it, a few
nodes then re-register with a GPU gone bad under its shard, and finally the
nodes take random admin states and liveness. `Node.objects.in_state()` and
`GPU.objects.free()` must then say what placement's own `load_fleet` view
says, and every page must count the same.
"""

from __future__ import annotations

import random
from collections import Counter

import pytest

from inventory.fleet import Fleet, Profile, load_fleet
from inventory.models import (
    GPU,
    HEALTH_OK,
    STATE_RULES,
    AdminState,
    Deployment,
    GPUClaim,
    Liveness,
    Node,
    NodeState,
    state_order,
)
from inventory.reconcile import reconcile
from tests.factories import H100, node, set_state
from tests.metrics_scrape import TEXT, body, named, samples

pytestmark = pytest.mark.django_db

A100 = "NVIDIA A100 40GB"
NODES = 50


def generated_fleet(seed: int) -> None:
    rng = random.Random(seed)
    shapes = {}
    for i in range(NODES):
        gpus = rng.choice([0, 2, 4, 8, 8])
        name = rng.choice([H100, A100])
        bad = {g: "2 uncorrectable ECC errors" for g in range(gpus) if rng.random() < 0.15}
        shapes[f"n{i:02d}"] = (gpus, name)
        node(f"n{i:02d}", gpus=gpus, gpu_name=name, health=bad)
    for k in range(4):
        Deployment.objects.create(
            name=f"d{k}",
            model_source=f"org/model-{k}",
            replicas=rng.randint(1, 12),
            gpus_per_shard=rng.choice([1, 2, 4]),
            gpu_class=rng.choice(["", "H100-80GB", "A100-40GB"]),
        )
    reconcile()
    # A GPU can go bad under a running shard: its claim stays, and it is not free.
    for name in rng.sample(sorted(shapes), 8):
        gpus, gpu_name = shapes[name]
        if gpus:
            node(name, gpus=gpus, gpu_name=gpu_name, health={0: "fallen off the bus"})
    states = [(admin, live) for admin in AdminState for live in Liveness]
    for name in shapes:
        set_state(name, *rng.choice(states))


def free_in(fleet: Fleet) -> set[tuple[str, int]]:
    return {(v.id, i) for v in fleet.nodes.values() for indices in v.free_gpus.values() for i in indices}


@pytest.fixture(params=[1, 2, 3], ids=lambda seed: f"seed{seed}")
def fleet(request, redis_client) -> Fleet:
    generated_fleet(request.param)
    return load_fleet()


def test_in_state_is_the_state_placement_and_each_node_see(fleet):
    for state in NodeState:
        in_state = set(Node.objects.in_state(state).values_list("pk", flat=True))
        assert in_state == {v.id for v in fleet.nodes.values() if v.state == state}, state
        assert in_state == {n.pk for n in Node.objects.all() if n.state == state}, state
    assert Node.objects.in_state(*NodeState).count() == NODES
    assert set(Node.objects.schedulable().values_list("pk", flat=True)) == {
        v.id for v in fleet.nodes.values() if v.schedulable
    }


def test_a_free_gpu_is_what_placement_may_still_hand_out(fleet):
    free = set(GPU.objects.free().values_list("node_id", "index"))
    assert free == free_in(fleet)
    # The generated fleet must exercise the rule: GPUs claimed, unhealthy, and both at once.
    claimed = set(GPUClaim.objects.values_list("node_id", "gpu_index"))
    unhealthy = set(GPU.objects.exclude(health=HEALTH_OK).values_list("node_id", "index"))
    assert claimed and unhealthy and claimed & unhealthy
    assert not free & (claimed | unhealthy)
    usable = set(GPU.objects.free().filter(node__in=Node.objects.schedulable()).values_list("node_id", flat=True))
    assert usable == {v.id for v in fleet.candidates(Profile(gpus=1))}


def test_the_cluster_page_counts_as_the_rules_do(client, viewer, fleet):
    client.force_login(viewer)
    page = client.get("/").context
    shown = {row.id: row for row in page["rows"]}
    assert len(shown) == NODES
    for v in fleet.nodes.values():
        total = sum(v.gpu_count.values())
        free = sum(len(indices) for indices in v.free_gpus.values())
        assert shown[v.id].gpus == (f"{free}/{total}" if total else ""), v.id
        assert shown[v.id].state == v.state
    states = Counter(v.state for v in fleet.nodes.values())
    assert dict(page["summary"].states) == {state: states[state] for state in NodeState}
    by_class = Counter(GPU.objects.free().values_list("gpu_class", flat=True))
    assert {c.gpu_class: c.free for c in page["summary"].totals.gpus} == {
        klass: by_class[klass] for klass in GPU.objects.values_list("gpu_class", flat=True)
    }
    for state in NodeState:
        filtered = client.get("/", {"state": state.value}).context
        assert {row.id for row in filtered["rows"]} == {v.id for v in fleet.nodes.values() if v.state == state}


def test_the_admin_counts_as_the_rules_do(client, operator, fleet):
    client.force_login(operator)
    listed = client.get("/admin/inventory/node/").context["cl"].result_list
    free = Counter(node_id for node_id, _ in free_in(fleet))
    assert {n.pk: n.gpu_free for n in listed} == {v.id: free[v.id] for v in fleet.nodes.values()}
    for state in NodeState:
        shown = client.get("/admin/inventory/node/", {"state": state.value}).context["cl"].result_list
        assert {n.pk for n in shown} == {v.id for v in fleet.nodes.values() if v.state == state}, state


def test_metrics_export_what_the_rules_say(client, fleet):
    found = samples(body(client.get("/metrics", headers={"Accept": TEXT})))
    exported = {dict(labels)["node"]: dict(labels)["state"] for labels in named(found, "llmgw_node_state")}
    assert exported == {v.id: v.state.value for v in fleet.nodes.values()}
    free = Counter((node_id, klass) for node_id, klass in GPU.objects.free().values_list("node_id", "gpu_class"))
    exported_free = {
        (dict(labels)["node"], dict(labels)["class"]): value
        for labels, value in named(found, "llmgw_node_gpus_free").items()
    }
    assert {key: value for key, value in exported_free.items() if value} == dict(free)
    per_node = Counter()
    for (node_id, _), value in exported_free.items():
        per_node[node_id] += value
    assert {k: v for k, v in per_node.items() if v} == dict(Counter(node_id for node_id, _ in free_in(fleet)))


def test_every_stored_pair_is_shown_in_one_state_by_both_encodings():
    for admin in AdminState:
        for live in Liveness:
            node(f"{admin}-{live}", gpus=0)
            set_state(f"{admin}-{live}", admin, live)
    for n in Node.objects.all():
        assert [s for s in NodeState if Node.objects.in_state(s).filter(pk=n.pk).exists()] == [n.state], n.pk
    worst_first = [state for state, _ in STATE_RULES]
    by_rule = sorted(Node.objects.all(), key=lambda n: (worst_first.index(n.state), n.pk))
    ranked = Node.objects.annotate(rank=state_order()).order_by("rank", "id")
    assert [n.pk for n in ranked] == [n.pk for n in by_rule]
