"""The admin: every state change needs a CSRF token, and nothing an agent reports is rendered as markup.

Login and staff-only access are covered in test_admin.py; these tests are the
attacker's side: a forged form post, and an agent reporting HTML.
"""

from __future__ import annotations

import pytest
from django.test import Client

from agent import protocol
from inventory.models import AdminState, Node
from tests.agentapi import JOIN_TOKEN, a_load, heartbeat, post
from tests.factories import make_inventory

pytestmark = pytest.mark.django_db

# One hostile string per field an agent controls; each carries its own marker so a
# failure names the field that leaked.
HOSTILE = {
    "hostname": '<script>alert("hostname")</script>',
    "label": "<img src=x onerror=alert('label')>",
    "engine_version": "<b onmouseover=alert('engine')>0.6</b>",
    "provision_detail": "<script>alert('detail')</script>",
    "gpu_name": "<svg onload=alert('gpu')>",
    "gpu_health": "<script>alert('health')</script>",
    "weights": "/models/<script>alert('weights')</script>",
    "mount": "/mnt/<iframe src=javascript:alert('mount')>",
    "fabric": "<script>alert('fabric')</script>",
    "kernel": "<script>alert('kernel')</script>",
}


def hostile_inventory() -> protocol.Inventory:
    inventory = make_inventory(
        HOSTILE["hostname"],
        labels={"rack": HOSTILE["label"]},
        engine_versions={"vllm": HOSTILE["engine_version"]},
        engines_probed=True,
        provision=[protocol.EngineInstall(engine="vllm", state="failed", detail=HOSTILE["provision_detail"])],
        weights=[protocol.Weights(path=HOSTILE["weights"])],
        weights_scanned=True,
        filesystems=[protocol.Filesystem(mount=HOSTILE["mount"], total_bytes=10, free_bytes=5)],
        fabrics=[protocol.Fabric(name=HOSTILE["fabric"], hcas=["mlx5_0"])],
    )
    inventory.gpus = [protocol.GPU(index=0, name=HOSTILE["gpu_name"], memory_bytes=2**30, health=HOSTILE["gpu_health"])]
    inventory.host.kernel = HOSTILE["kernel"]
    return inventory


@pytest.fixture
def hostile_node(client, settings, redis_client):
    """A node that reported hostile strings through the real agent API, as an agent would."""
    settings.LLMGW_JOIN_TOKEN = JOIN_TOKEN
    registration = protocol.Register(node_id="evil-1", inventory=hostile_inventory(), inventory_hash="h1")
    response = post(client, "/api/v1/register", registration, JOIN_TOKEN)
    assert response.status_code == 200, response.content
    token = protocol.decode(response.content, protocol.Registered).token
    beat = protocol.Heartbeat(
        inventory_hash="h1",
        load=a_load(),
        shards=[protocol.ShardStatus(shard="evil-shard", state="failed", detail=HOSTILE["provision_detail"])],
    )
    assert heartbeat(client, token, beat).status_code == 200
    return Node.objects.get(pk="evil-1")


def assert_escaped(body: str) -> None:
    for field, value in HOSTILE.items():
        # The dangerous part of each value: its opening tag.
        tag = value[value.index("<") : value.index(">") + 1]
        assert tag not in body, f"{field} rendered unescaped"


@pytest.mark.parametrize(
    "path",
    [
        "/admin/inventory/node/",
        "/admin/inventory/node/evil-1/change/",
        "/admin/inventory/nodeevent/",
        "/admin/inventory/node/?q=evil",
    ],
)
def test_agent_reported_markup_is_escaped_in_the_admin(client, operator, hostile_node, path):
    client.force_login(operator)
    response = client.get(path)
    assert response.status_code == 200
    body = response.content.decode()
    assert_escaped(body)
    if path.endswith("/change/"):
        assert "&lt;script&gt;alert(&quot;hostname&quot;)&lt;/script&gt;" in body  # shown, as text


def test_action_confirmation_page_escapes_the_hostname(client, operator, hostile_node):
    client.force_login(operator)
    response = client.post("/admin/inventory/node/", {"action": "cordon", "_selected_action": ["evil-1"]})
    assert response.status_code == 200
    assert_escaped(response.content.decode())


@pytest.fixture
def csrf_client():
    return Client(enforce_csrf_checks=True)


def logged_in(client: Client, username: str, password: str) -> str:
    """Log in through the form, as a browser does; returns the CSRF token the pages carry."""
    client.get("/admin/login/")
    token = client.cookies["csrftoken"].value
    response = client.post(
        "/admin/login/", {"username": username, "password": password, "csrfmiddlewaretoken": token, "next": "/admin/"}
    )
    assert response.status_code == 302
    return client.cookies["csrftoken"].value


def test_login_itself_needs_the_csrf_token(csrf_client, operator):
    response = csrf_client.post("/admin/login/", {"username": "operator", "password": "operator-pass"})
    assert response.status_code == 403
    assert "_auth_user_id" not in csrf_client.session


@pytest.mark.parametrize(("action", "start"), [("cordon", "active"), ("drain", "active"), ("uncordon", "cordoned")])
def test_admin_actions_refuse_a_forged_post(csrf_client, operator, cluster, action, start):
    Node.objects.filter(pk="ready-1").update(admin_state=start)
    token = logged_in(csrf_client, "operator", "operator-pass")
    form = {"action": action, "_selected_action": ["ready-1"], "apply": "1", "reason": "forged"}
    assert csrf_client.post("/admin/inventory/node/", form).status_code == 403
    assert Node.objects.get(pk="ready-1").admin_state == start
    # The same post with the token goes through: the 403 was the token, nothing else.
    response = csrf_client.post("/admin/inventory/node/", {**form, "csrfmiddlewaretoken": token})
    assert response.status_code == 302
    assert Node.objects.get(pk="ready-1").admin_state != start


def test_editing_a_node_refuses_a_forged_post(csrf_client, operator, cluster):
    logged_in(csrf_client, "operator", "operator-pass")
    response = csrf_client.post(
        "/admin/inventory/node/ready-1/change/", {"notes": "forged", "operator_labels": '{"a": "b"}'}
    )
    assert response.status_code == 403
    assert Node.objects.get(pk="ready-1").notes == ""


def test_logout_refuses_a_forged_post(csrf_client, operator):
    logged_in(csrf_client, "operator", "operator-pass")
    assert csrf_client.post("/admin/logout/").status_code == 403
    assert "_auth_user_id" in csrf_client.session


def test_a_token_from_another_session_is_refused(csrf_client, operator, cluster):
    other = Client(enforce_csrf_checks=True)
    other.get("/admin/login/")
    stolen = other.cookies["csrftoken"].value
    logged_in(csrf_client, "operator", "operator-pass")
    form = {"action": "cordon", "_selected_action": ["ready-1"], "apply": "1", "reason": "x"}
    response = csrf_client.post("/admin/inventory/node/", {**form, "csrfmiddlewaretoken": stolen})
    assert response.status_code == 403
    assert Node.objects.get(pk="ready-1").admin_state == AdminState.ACTIVE


def test_non_staff_cannot_post_actions_even_with_a_token(csrf_client, viewer, cluster):
    csrf_client.force_login(viewer)
    csrf_client.get("/admin/login/")
    token = csrf_client.cookies["csrftoken"].value
    form = {"action": "cordon", "_selected_action": ["ready-1"], "apply": "1", "reason": "x"}
    response = csrf_client.post("/admin/inventory/node/", {**form, "csrfmiddlewaretoken": token})
    assert response.status_code == 302
    assert "/admin/login/" in response["Location"]
    assert Node.objects.get(pk="ready-1").admin_state == AdminState.ACTIVE
