"""Acting through the operators' API: node actions recorded with the token, deployments created, scaled, deleted."""

from __future__ import annotations

import pytest
from django.contrib.admin.models import ADDITION, CHANGE, DELETION, LogEntry
from django.db import connection
from django.test.utils import CaptureQueriesContext

from inventory.models import Deployment, Node, NodeEvent, Replica, ReplicaState
from inventory.reconcile import reconcile
from tests.opsapi_support import Caller, make_token

pytestmark = pytest.mark.django_db


@pytest.fixture
def operate(client, operator):
    token, secret = make_token(operator, scope="operate", name="maintenance")
    caller = Caller(client, secret)
    caller.token = token
    return caller


def test_cordon_by_id_is_recorded_with_who_why_and_which_token(operate, cluster):
    response = operate.post("/node-actions/", {"action": "cordon", "reason": "kernel 6.12", "nodes": ["ready-1"]})
    assert response.status_code == 200
    assert response.json()["results"] == [
        {"node": "ready-1", "changed": True, "admin_state": "cordoned", "state": "cordoned"}
    ]
    node = Node.objects.get(pk="ready-1")
    assert node.admin_state == "cordoned" and node.admin_state_reason == "kernel 6.12"
    event = NodeEvent.objects.get(node_id="ready-1", kind="admin")
    label = operate.token.label
    assert event.actor == f"operator via token {label}" and event.reason == "kernel 6.12"
    entry = LogEntry.objects.get(object_id="ready-1")
    assert entry.user.username == "operator" and entry.action_flag == CHANGE
    assert entry.change_message == f"active → cordoned: kernel 6.12 (through API token {label})"


def test_an_action_on_a_node_already_in_that_state_changes_and_records_nothing(operate, cluster):
    body = {"action": "cordon", "reason": "again", "nodes": ["cordoned-1"]}
    assert operate.post("/node-actions/", body).json()["changed"] == 0
    assert not NodeEvent.objects.filter(node_id="cordoned-1").exists()


def test_a_label_selector_picks_the_rack(operate, cluster):
    Node.objects.filter(pk__in=["ready-1", "lost-1"]).update(labels={"rack": "r12", "zone": "a"})
    Node.objects.filter(pk="unreachable-1").update(labels={"rack": "r12", "zone": "b"})
    response = operate.post("/node-actions/", {"action": "drain", "reason": "reboot", "selector": "rack=r12,zone=a"})
    assert [r["node"] for r in response.json()["results"]] == ["lost-1", "ready-1"]
    assert set(Node.objects.filter(admin_state="draining").values_list("pk", flat=True)) == {"lost-1", "ready-1"}


@pytest.mark.parametrize(
    "body, field",
    [
        ({"action": "cordon", "nodes": ["ready-1"]}, "reason"),
        ({"action": "cordon", "reason": "   ", "nodes": ["ready-1"]}, "reason"),
        ({"action": "reboot", "reason": "x", "nodes": ["ready-1"]}, "action"),
        ({"action": "cordon", "reason": "x"}, "nodes"),
        ({"action": "cordon", "reason": "x", "nodes": ["ready-1"], "selector": "a=b"}, "nodes"),
        ({"action": "cordon", "reason": "x", "nodes": ["ready-1", "ghost"]}, "nodes"),
        ({"action": "cordon", "reason": "x", "nodes": "ready-1"}, "nodes"),
        ({"action": "cordon", "reason": "x", "selector": "rack"}, "selector"),
        ({"action": "cordon", "reason": "x", "selector": "rack=nowhere"}, "selector"),
    ],
)
def test_a_bad_action_is_a_400_naming_the_field_and_changes_nothing(operate, cluster, body, field):
    response = operate.post("/node-actions/", body)
    assert response.status_code == 400, response.content
    assert response.json()["field"] == field
    assert Node.objects.get(pk="ready-1").admin_state == "active"


def test_a_body_that_is_not_json_is_a_400(operate, cluster):
    response = operate.client.post(
        "/api/ops/v1/node-actions/", "{not json", content_type="application/json", **operate.headers
    )
    assert response.status_code == 400 and "error" in response.json()


def test_drain_returns_at_once_and_its_progress_is_readable(operate, cluster):
    Deployment.objects.create(name="llama", model_source="llama", engine="demo", replicas=1, gpus_per_shard=1)
    reconcile()
    assert Replica.objects.get().shards.get().node_id == "ready-1"
    operate.post("/node-actions/", {"action": "drain", "reason": "reboot", "nodes": ["ready-1"]})
    progress = operate.get("/nodes/ready-1/drain/").json()
    assert progress["admin_state"] == "draining"
    assert (progress["replicas_left"], progress["shards_left"], progress["drained"]) == (1, 1, False)
    # Once nothing is left on it, the reconciler cordons it and the drain reads as done.
    Replica.objects.all().delete()
    reconcile()
    done = operate.get("/nodes/ready-1/drain/").json()
    assert (done["admin_state"], done["replicas_left"], done["drained"]) == ("cordoned", 0, True)


def test_deployments_are_created_scaled_and_deleted_and_logged(operate, cluster):
    body = {"name": "llama", "model_source": "llama", "engine": "demo", "replicas": 1, "max_in_flight_per_replica": 4}
    created = operate.post("/deployments/", body)
    assert created.status_code == 201, created.content
    assert created.json()["replicas_wanted"] == 1
    assert created.json()["max_in_flight_per_replica"] == 4
    reconcile()
    listed = operate.get("/deployments/").json()["results"][0]
    assert listed["replicas"][0]["shards"][0]["node"] == "ready-1"
    scaled = operate.patch("/deployments/llama/", {"replicas": 3})
    assert scaled.json()["replicas_wanted"] == 3
    assert Deployment.objects.get().replicas == 3
    assert operate.delete("/deployments/llama/").status_code == 204
    assert not Deployment.objects.exists()
    entries = LogEntry.objects.filter(content_type__model="deployment").order_by("pk")
    assert [e.action_flag for e in entries] == [ADDITION, CHANGE, DELETION]
    assert all(e.change_message.endswith(f"(through API token {operate.token.label})") for e in entries)


def test_a_replica_that_cannot_be_placed_says_why(operate, cluster):
    operate.post(
        "/deployments/",
        {"name": "big", "model_source": "big", "engine": "vllm", "gpus_per_shard": 4, "gpu_class": "B200-192GB"},
    )
    reconcile()
    deployment = operate.get("/deployments/big/").json()
    assert deployment["not_placed"][0]["replica"] == "big-r1"
    assert "B200-192GB" in deployment["not_placed"][0]["reason"]
    assert deployment["replicas"][0]["state"] == ReplicaState.PENDING


@pytest.mark.parametrize(
    "body, field",
    [
        ({"model_source": "m"}, "name"),
        ({"name": "Bad Name", "model_source": "m"}, "name"),
        ({"name": "ok", "model_source": "m", "engine": "tgi"}, "engine"),
        ({"name": "ok", "model_source": "m", "replicas": -1}, "replicas"),
        ({"name": "ok", "model_source": "m", "gpus_per_shard": 0, "gpu_class": "H100-80GB"}, "gpu_class"),
        ({"name": "ok", "model_source": "m", "engine": "command"}, "arguments"),
        ({"name": "ok", "model_source": "m", "arguments": "'unclosed"}, "arguments"),
        ({"name": "ok", "model_source": "m", "max_in_flight_per_replica": 0}, "max_in_flight_per_replica"),
        ({"name": "ok", "model_source": "m", "max_in_flight_per_replica": "many"}, "max_in_flight_per_replica"),
    ],
)
def test_a_bad_deployment_is_a_400_naming_the_field(operate, db, body, field):
    response = operate.post("/deployments/", body)
    assert response.status_code == 400, response.content
    assert response.json()["field"] == field
    assert not Deployment.objects.exists()


def test_a_second_deployment_of_the_same_name_is_refused(operate, db):
    body = {"name": "llama", "model_source": "m"}
    assert operate.post("/deployments/", body).status_code == 201
    again = operate.post("/deployments/", body)
    assert again.status_code == 400 and again.json()["field"] == "name"


def test_scaling_refuses_a_bad_count_and_an_unknown_deployment(operate, db):
    operate.post("/deployments/", {"name": "llama", "model_source": "m"})
    assert operate.patch("/deployments/llama/", {"replicas": "many"}).json()["field"] == "replicas"
    assert operate.patch("/deployments/llama/", {}).json()["field"] == "replicas"
    assert operate.patch("/deployments/nope/", {"replicas": 1}).status_code == 404


def test_the_deployments_list_asks_as_many_queries_for_many_replicas_as_for_one(operate, cluster):
    def queries() -> int:
        operate.get("/deployments/")  # the token's first use of the minute also notes when it was used
        with CaptureQueriesContext(connection) as captured:
            assert operate.get("/deployments/").status_code == 200
        return len(captured)

    Deployment.objects.create(name="a", model_source="a", engine="demo", replicas=1, gpus_per_shard=1)
    reconcile()
    few = queries()
    for name in ("b", "c", "d"):
        Deployment.objects.create(name=name, model_source=name, engine="demo", replicas=2, gpus_per_shard=1)
    reconcile()
    assert Replica.objects.count() == 7
    assert queries() == few
