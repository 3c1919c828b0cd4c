"""Reading nodes through the operators' API: the cluster page's filters, sort and paging, one node, events."""

from __future__ import annotations

import time

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from agent import protocol
from inventory.models import AdminState, Node, NodeEvent
from inventory.operator import set_admin_state
from inventory.registration import upsert_inventory
from tests.opsapi_support import Caller, database_unreachable, loadstore, make_inventory, make_token

pytestmark = pytest.mark.django_db


@pytest.fixture
def reader(client, viewer):
    _, secret = make_token(viewer)
    return Caller(client, secret)


def test_the_list_pages_and_filters_with_the_cluster_pages_names(reader, cluster):
    Node.objects.filter(pk="cordoned-1").update(operator_labels={"rack": "r12"})
    every = reader.get("/nodes/").json()
    assert every["count"] == 4 and [r["id"] for r in every["results"]] == sorted(cluster)
    assert reader.get("/nodes/", state="cordoned").json()["results"][0]["id"] == "cordoned-1"
    assert [r["id"] for r in reader.get("/nodes/", label="rack=r12").json()["results"]] == ["cordoned-1"]
    worst_first = reader.get("/nodes/", sort="state").json()["results"]
    assert [r["state"] for r in worst_first] == ["lost", "unreachable", "cordoned", "ready"]
    paged = reader.get("/nodes/", page_size=3, page=2).json()
    assert (paged["count"], paged["pages"], paged["previous"], paged["next"]) == (4, 2, 1, None)
    assert len(paged["results"]) == 1
    row = every["results"][0]
    assert row["gpus"] == {"total": 8, "free": 8, "classes": ["H100-80GB"]}


def test_a_row_carries_the_load_as_numbers_with_its_age(reader, cluster, redis_client):
    load = protocol.Load(cpu_percent=42.5, cpus=192, load1=3.0, memory_used_bytes=10, memory_available_bytes=30)
    loadstore.save("ready-1", load, time.time() - 2)
    row = next(r for r in reader.get("/nodes/").json()["results"] if r["id"] == "ready-1")
    assert row["load"]["cpu_percent"] == 42.5 and row["load"]["memory_used_bytes"] == 10
    assert 1.5 < row["load"]["age_seconds"] < 10
    other = next(r for r in reader.get("/nodes/").json()["results"] if r["id"] == "lost-1")
    assert other["load"] is None and other["load_age_seconds"] is None


def test_sorting_by_load_puts_unknown_loads_last(reader, cluster, redis_client):
    for node_id, cpu in (("ready-1", 10.0), ("cordoned-1", 90.0)):
        loadstore.save(node_id, protocol.Load(cpu_percent=cpu, cpus=8), time.time())
    ids = [r["id"] for r in reader.get("/nodes/", sort="-cpu").json()["results"]]
    assert ids[:2] == ["cordoned-1", "ready-1"]


@pytest.mark.parametrize(
    "query, field",
    [
        ({"sort": "colour"}, "sort"),
        ({"state": "sleepy"}, "state"),
        ({"page": "two"}, "page"),
        ({"page": "0"}, "page"),
        ({"page_size": "501"}, "page_size"),
        ({"q": "a\x00b"}, "q"),
        ({"label": "x" * 201}, "label"),
    ],
)
def test_a_bad_parameter_is_a_400_naming_it(reader, cluster, query, field):
    response = reader.get("/nodes/", **query)
    assert response.status_code == 400
    assert response.json()["field"] == field and field in response.json()["error"]


def test_the_list_asks_as_many_queries_at_60_nodes_as_at_6(reader, cluster, redis_client):
    def queries() -> int:
        reader.get("/nodes/")  # the token's first use of the minute also notes when it was used
        with CaptureQueriesContext(connection) as captured:
            assert reader.get("/nodes/", sort="gpus").status_code == 200
        return len(captured)

    small = queries()
    now = timezone.now()
    for i in range(56):
        upsert_inventory(f"n{i:03}", make_inventory(f"n{i}.example", gpus=2), now=now)
    assert queries() == small


def test_one_node_whole(reader, operator, cluster, redis_client):
    NodeEvent.objects.create(node_id="ready-1", kind="liveness", from_state="unreachable", to_state="alive")
    loadstore.save(
        "ready-1",
        protocol.Load(cpu_percent=5.0, cpus=192, shards=[protocol.ShardLoad(shard="x-s0", cpu_cores=1.5)]),
        time.time(),
    )
    node = reader.get("/nodes/ready-1/").json()
    assert node["state"] == "ready" and node["hostname"] == "ready-1.example"
    assert len(node["gpus"]) == 8 and node["gpus"][0]["held_by"] is None
    assert node["load"]["shards"] == [{"shard": "x-s0", "cpu_cores": 1.5, "rss_bytes": 0}]
    # Active: nothing is "left to move"; drain progress is for a node that drains.
    assert node["drain"] is None
    assert [(e["kind"], e["to_state"]) for e in node["events"]] == [("liveness", "alive")]
    set_admin_state(Node.objects.get(pk="ready-1"), AdminState.DRAINING, operator, "reboot")
    assert reader.get("/nodes/ready-1/").json()["drain"] == {
        "node": "ready-1",
        "admin_state": "draining",
        "state": "draining",
        "replicas_left": 0,
        "shards_left": 0,
        "drained": False,
    }


def test_an_unknown_node_is_a_404_in_json(reader, db):
    for path in ("/nodes/nope/", "/nodes/nope/drain/", "/nodes/a%00b/"):
        response = reader.get(path)
        assert response.status_code == 404, path
        assert "error" in response.json()


def test_events_follow_a_cursor(reader, cluster):
    for node_id in ("ready-1", "cordoned-1", "unreachable-1"):
        NodeEvent.objects.create(node_id=node_id, kind="registration", reason="registered")
    latest = reader.get("/events/", limit=2).json()
    assert len(latest["events"]) == 2 and latest["cursor"] == latest["events"][-1]["id"]
    assert reader.get("/events/", since=latest["cursor"]).json() == {
        "cursor": latest["cursor"],
        "more": False,
        "events": [],
    }
    NodeEvent.objects.create(node_id="ready-1", kind="admin", from_state="active", to_state="cordoned", reason="x")
    NodeEvent.objects.create(node_id="lost-1", kind="liveness", from_state="alive", to_state="lost")
    after = reader.get("/events/", since=latest["cursor"], limit=1).json()
    assert [e["node"] for e in after["events"]] == ["ready-1"] and after["more"] is True
    rest = reader.get("/events/", since=after["cursor"]).json()
    assert [e["node"] for e in rest["events"]] == ["lost-1"] and rest["more"] is False
    only = reader.get("/events/", since=latest["cursor"], node="lost-1").json()
    assert [e["to_state"] for e in only["events"]] == ["lost"]


def test_events_refuse_a_bad_cursor(reader, db):
    response = reader.get("/events/", since="yesterday")
    assert response.status_code == 400 and response.json()["field"] == "since"
    assert reader.get("/events/", limit=501).json()["field"] == "limit"


def test_an_unknown_path_under_the_prefix_is_a_json_404(reader, db):
    response = reader.get("/no-such-thing/")
    assert response.status_code == 404 and "no such endpoint" in response.json()["error"]


def test_a_method_the_endpoint_lacks_is_a_json_405(client, operator):
    _, secret = make_token(operator, scope="operate")
    operate = Caller(client, secret)
    response = operate.client.put("/api/ops/v1/nodes/", **operate.headers)
    assert response.status_code == 405 and "PUT" in response.json()["error"]


@pytest.mark.django_db(transaction=True)
def test_the_database_down_is_a_503_not_a_500(client, viewer):
    _, secret = make_token(viewer)
    with database_unreachable():
        response = Caller(client, secret).get("/nodes/")
    assert response.status_code == 503 and "database" in response.json()["error"]
