"""The operators' admin: who may reach it, and cordon, drain and uncordon."""

import time

import pytest
from django.contrib.admin.helpers import ACTION_CHECKBOX_NAME
from django.contrib.admin.models import CHANGE, LogEntry

from agent import protocol
from devstack.faults import redis_unreachable
from inventory.models import AdminState, Node, NodeEvent, gpu_class
from livestate import loadstore

pytestmark = pytest.mark.django_db

CHANGELIST = "/admin/inventory/node/"


def test_anonymous_is_sent_to_login(client, cluster):
    response = client.get(CHANGELIST)
    assert response.status_code == 302
    assert response["Location"].startswith("/admin/login/")


def test_non_staff_cannot_reach_the_admin(client, viewer, cluster):
    client.force_login(viewer)
    response = client.get(CHANGELIST)
    assert response.status_code == 302
    assert response["Location"].startswith("/admin/login/")
    response = client.post(
        CHANGELIST, {"action": "cordon", ACTION_CHECKBOX_NAME: ["ready-1"], "apply": "1", "reason": "no"}
    )
    assert Node.objects.get(pk="ready-1").admin_state == AdminState.ACTIVE


def test_staff_without_change_permission_cannot_act(client, django_user_model, cluster):
    watcher = django_user_model.objects.create_user("watcher", password="pw", is_staff=True)
    client.force_login(watcher)
    client.post(CHANGELIST, {"action": "cordon", ACTION_CHECKBOX_NAME: ["ready-1"], "apply": "1", "reason": "x"})
    assert Node.objects.get(pk="ready-1").admin_state == AdminState.ACTIVE


def test_node_list_shows_state_gpus_and_load(client, operator, cluster, redis_client):
    load = protocol.Load(cpu_percent=37.5, cpus=192, memory_used_bytes=100 * 2**30, memory_available_bytes=412 * 2**30)
    loadstore.save("ready-1", load, time.time())
    client.force_login(operator)
    response = client.get(CHANGELIST)
    assert response.status_code == 200
    body = response.content.decode()
    for node_id in cluster:
        assert node_id in body
    assert "38% of 192" in body
    assert "100.0 / 512.0 GiB" in body
    assert "8/8" in body
    assert "llmgw-badge llmgw-amber" in body  # the cordoned node


def test_node_list_still_renders_when_redis_is_down(client, operator, cluster, settings):
    client.force_login(operator)
    with redis_unreachable(settings):
        response = client.get(CHANGELIST)
    assert response.status_code == 200
    assert "ready-1" in response.content.decode()


@pytest.mark.parametrize(
    ("action", "start", "end"),
    [
        ("cordon", AdminState.ACTIVE, AdminState.CORDONED),
        ("drain", AdminState.ACTIVE, AdminState.DRAINING),
        ("uncordon", AdminState.CORDONED, AdminState.ACTIVE),
    ],
)
def test_action_asks_for_a_reason_then_records_who_when_why(client, operator, cluster, action, start, end):
    Node.objects.filter(pk="ready-1").update(admin_state=start)
    client.force_login(operator)

    asked = client.post(CHANGELIST, {"action": action, ACTION_CHECKBOX_NAME: ["ready-1"]})
    assert asked.status_code == 200
    assert 'name="reason"' in asked.content.decode()
    assert Node.objects.get(pk="ready-1").admin_state == start

    done = client.post(
        CHANGELIST, {"action": action, ACTION_CHECKBOX_NAME: ["ready-1"], "apply": "1", "reason": "replacing a DIMM"}
    )
    assert done.status_code == 302
    node = Node.objects.get(pk="ready-1")
    assert node.admin_state == end
    assert node.admin_state_by == operator.username
    assert node.admin_state_reason == "replacing a DIMM"
    assert node.admin_state_at is not None
    event = NodeEvent.objects.get(node=node, kind=NodeEvent.Kind.ADMIN)
    assert (event.from_state, event.to_state, event.actor) == (start, end, operator.username)
    entry = LogEntry.objects.get(object_id="ready-1")
    assert entry.user == operator
    assert entry.action_flag == CHANGE
    assert "replacing a DIMM" in entry.change_message


def test_action_without_a_reason_changes_nothing(client, operator, cluster):
    client.force_login(operator)
    response = client.post(
        CHANGELIST, {"action": "cordon", ACTION_CHECKBOX_NAME: ["ready-1"], "apply": "1", "reason": "   "}
    )
    assert response.status_code == 200
    assert Node.objects.get(pk="ready-1").admin_state == AdminState.ACTIVE
    assert not LogEntry.objects.exists()


def test_agent_reported_inventory_is_read_only(client, operator, cluster):
    client.force_login(operator)
    url = f"{CHANGELIST}ready-1/change/"
    page = client.get(url)
    assert page.status_code == 200
    form = page.context["adminform"].form
    assert "hostname" not in form.fields
    assert "admin_state" not in form.fields
    assert set(form.fields) == {"operator_labels", "notes"}
    data = {
        "operator_labels": '{"team": "infra"}',
        "notes": "rack 4",
        "hostname": "evil.example",
        "admin_state": "cordoned",
    }
    for inline in page.context["inline_admin_formsets"]:
        management = inline.formset.management_form
        for name, field in management.fields.items():
            data[f"{management.prefix}-{name}"] = management.initial.get(name, field.initial) or 0
    response = client.post(url, data)
    assert response.status_code == 302, response.content.decode()[:2000]
    node = Node.objects.get(pk="ready-1")
    assert node.operator_labels == {"team": "infra"}
    assert node.notes == "rack 4"
    assert node.hostname == "ready-1.example"
    assert node.admin_state == AdminState.ACTIVE


def test_node_page_shows_its_allocations(client, operator, cluster):
    from tests.factories import place

    place("llama", {"ready-1": [0, 1]}, memory_gb=64, model="/models/llama")
    client.force_login(operator)
    body = client.get(f"{CHANGELIST}ready-1/change/").content.decode()
    assert "llama-r1-s0" in body
    assert "0, 1" in body


def test_nodes_cannot_be_added_by_hand(client, operator):
    client.force_login(operator)
    assert client.get(f"{CHANGELIST}add/").status_code == 403


@pytest.mark.parametrize("state", ["ready", "cordoned", "unreachable", "lost"])
def test_filter_by_state(client, operator, cluster, state):
    client.force_login(operator)
    response = client.get(CHANGELIST, {"state": state})
    shown = [node.pk for node in response.context["cl"].result_list]
    assert shown == [f"{state}-1"]


def test_filter_by_gpu_class_label_and_fabric_and_search(client, operator, cluster):
    from inventory.registration import upsert_inventory
    from tests.factories import make_inventory

    upsert_inventory(
        "l4-1",
        make_inventory(
            "l4.example", gpus=2, gpu_name="NVIDIA L4", labels={"zone": "b"}, fabrics=[protocol.Fabric(name="ib-a")]
        ),
    )
    client.force_login(operator)

    def shown(**params):
        return [node.pk for node in client.get(CHANGELIST, params).context["cl"].result_list]

    assert shown(gpu_class=gpu_class("NVIDIA L4", 80 * 2**30)) == ["l4-1"]
    assert shown(label="zone=b") == ["l4-1"]
    assert shown(fabric="ib-a") == ["l4-1"]
    assert shown(q="l4.example") == ["l4-1"]


def test_changelist_query_count_does_not_grow_with_the_fleet(client, operator, django_assert_max_num_queries):
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from inventory.registration import upsert_inventory
    from tests.factories import make_inventory

    client.force_login(operator)

    def count_queries():
        with CaptureQueriesContext(connection) as captured:
            assert client.get(CHANGELIST).status_code == 200
        return len(captured)

    for i in range(10):
        upsert_inventory(f"a{i:03}", make_inventory(f"a{i}.example", gpus=2))
    at_ten = count_queries()
    for i in range(10, 150):
        upsert_inventory(f"a{i:03}", make_inventory(f"a{i}.example", gpus=2))
    assert count_queries() == at_ten


def test_what_the_agent_owns_is_read_only_in_the_admin():
    from django.contrib import admin

    from inventory.models import AGENT_FIELDS

    readonly = admin.site._registry[Node].readonly_fields
    assert set(AGENT_FIELDS) <= set(readonly)
    assert {"operator_labels", "notes"}.isdisjoint(readonly)
