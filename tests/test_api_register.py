"""POST /api/v1/register: join tokens, node tokens, rotation and revocation."""

import pytest

from agent import protocol
from inventory.models import AdminState, Liveness, Node, NodeEvent
from nodes.models import JoinToken, NodeToken
from tests.agentapi import JOIN_TOKEN, heartbeat, post, register, reply_of
from tests.factories import make_inventory

pytestmark = [pytest.mark.django_db]


@pytest.fixture(autouse=True)
def _join_token(settings, redis_client):
    settings.LLMGW_JOIN_TOKEN = JOIN_TOKEN


def test_registration_creates_the_node_and_returns_a_working_token(client):
    token = register(client, "gpu-1", gpus=4)

    node = Node.objects.get(pk="gpu-1")
    assert node.gpus.count() == 4
    assert node.liveness == Liveness.ALIVE
    assert reply_of(heartbeat(client, token, protocol.Heartbeat())).state == "ready"
    event = NodeEvent.objects.get(node=node, kind=NodeEvent.Kind.REGISTRATION)
    assert event.reason == "registered"


def test_only_a_digest_of_the_node_token_is_stored(client):
    token = register(client, "gpu-1")

    stored = NodeToken.objects.get(node_id="gpu-1")
    secret = token.rpartition(".")[2]
    assert secret not in stored.secret_digest
    assert len(stored.secret_digest) == 64


@pytest.mark.parametrize("bearer", [None, "", "wrong-token", JOIN_TOKEN + "x"])
def test_registration_without_the_join_token_is_refused_and_stores_nothing(client, bearer):
    message = protocol.Register(node_id="gpu-1", inventory=make_inventory("gpu-1.example"))
    response = post(client, "/api/v1/register", message, bearer)

    assert response.status_code == 401
    assert protocol.decode(response.content, protocol.Rejection).field == "Authorization"
    assert not Node.objects.exists()


def test_an_empty_cluster_join_token_lets_no_one_in(client, settings):
    settings.LLMGW_JOIN_TOKEN = ""
    response = post(client, "/api/v1/register", protocol.Register(node_id="gpu-1"), "")
    assert response.status_code == 401
    response = post(client, "/api/v1/register", protocol.Register(node_id="gpu-1"), ".")
    assert response.status_code == 401
    assert not Node.objects.exists()


def test_an_admin_join_token_works_until_revoked(client, settings):
    settings.LLMGW_JOIN_TOKEN = ""
    join_token = JoinToken(name="rack 7")
    secret = join_token.issue()
    join_token.save()

    register(client, "gpu-1", join_token=secret)
    join_token.refresh_from_db()
    assert join_token.last_used_at is not None
    assert secret.rpartition(".")[2] not in join_token.secret_digest

    join_token.revoke()
    response = post(client, "/api/v1/register", protocol.Register(node_id="gpu-2"), secret)
    assert response.status_code == 401
    assert not Node.objects.filter(pk="gpu-2").exists()


def test_registering_again_rotates_the_token_and_is_recorded(client):
    old = register(client, "gpu-1")
    new = register(client, "gpu-1")

    assert old != new
    assert heartbeat(client, old, protocol.Heartbeat()).status_code == 401
    assert heartbeat(client, new, protocol.Heartbeat()).status_code == 200
    reasons = list(NodeEvent.objects.filter(node_id="gpu-1", kind=NodeEvent.Kind.REGISTRATION).values_list("reason"))
    assert ("re-registered; token rotated",) in reasons


def test_registering_again_keeps_a_cordon_and_brings_a_lost_node_back(client):
    register(client, "gpu-1")
    Node.objects.filter(pk="gpu-1").update(admin_state=AdminState.CORDONED, liveness=Liveness.LOST)

    register(client, "gpu-1", gpus=2)

    node = Node.objects.get(pk="gpu-1")
    assert node.admin_state == AdminState.CORDONED
    assert node.liveness == Liveness.ALIVE
    assert node.gpus.count() == 2


def test_a_revoked_node_token_is_refused_until_the_node_registers_again(client, operator):
    token = register(client, "gpu-1")
    assert heartbeat(client, token, protocol.Heartbeat()).status_code == 200

    assert NodeToken.objects.get(node_id="gpu-1").revoke("operator")

    response = heartbeat(client, token, protocol.Heartbeat())
    assert response.status_code == 401
    assert NodeEvent.objects.filter(node_id="gpu-1", reason="node token revoked", actor="operator").exists()
    assert heartbeat(client, register(client, "gpu-1"), protocol.Heartbeat()).status_code == 200


def test_the_admin_revokes_a_node_token(client, operator):
    token = register(client, "gpu-1")
    client.force_login(operator)

    response = client.post("/admin/nodes/nodetoken/", {"action": "revoke", "_selected_action": ["gpu-1"]}, follow=True)

    assert response.status_code == 200
    client.logout()
    assert heartbeat(client, token, protocol.Heartbeat()).status_code == 401


def test_the_admin_makes_a_join_token_and_shows_it_once(client, operator, settings):
    settings.LLMGW_JOIN_TOKEN = ""
    client.force_login(operator)

    response = client.post("/admin/nodes/jointoken/add/", {"name": "rack 9"}, follow=True)

    join_token = JoinToken.objects.get(name="rack 9")
    shown = next(str(m) for m in response.context["messages"] if join_token.key in str(m))
    secret = shown.split(": ", 1)[1].split(" ", 1)[0]
    client.logout()
    register(client, "gpu-9", join_token=secret)

    client.force_login(operator)
    client.post("/admin/nodes/jointoken/", {"action": "revoke", "_selected_action": [join_token.pk]})
    client.logout()
    assert post(client, "/api/v1/register", protocol.Register(node_id="gpu-10"), secret).status_code == 401


def test_a_viewer_cannot_revoke_tokens(client, viewer):
    token = register(client, "gpu-1")
    client.force_login(viewer)

    response = client.post("/admin/nodes/nodetoken/", {"action": "revoke", "_selected_action": ["gpu-1"]})

    assert response.status_code == 302  # to the login page
    client.logout()
    assert heartbeat(client, token, protocol.Heartbeat()).status_code == 200


def test_an_invalid_registration_names_the_field(client):
    response = post(client, "/api/v1/register", b'{"node_id": "../etc"}', JOIN_TOKEN)
    assert response.status_code == 400
    assert protocol.decode(response.content, protocol.Rejection).field == "$.node_id"
    assert not Node.objects.exists()


def test_a_node_id_with_dots_and_colons_gets_a_working_token(client):
    token = register(client, "rack1.gpu-1:a")
    assert token.startswith("rack1.gpu-1:a.")
    assert reply_of(heartbeat(client, token, protocol.Heartbeat())).state == "ready"


def test_a_new_node_registers_in_one_insert_per_table_whatever_its_inventory(client, django_assert_num_queries):
    """A fleet's bootstrap is bound by round trips to the database: a new node reads and deletes nothing.

    The soak's inventory (bench/fleetlib/bodies.py) fills every hardware table: 8 GPUs,
    filesystems, weights, fabrics and engine installs, one INSERT each.
    """
    import random

    from bench.fleetlib import bodies

    message, _ = bodies.registration(3, random.Random(3))
    inventory = message.inventory
    assert inventory.gpus and inventory.filesystems and inventory.weights and inventory.fabrics and inventory.provision
    # The node's locking read and INSERT, the inventory's savepoint and its release, five
    # hardware INSERTs, the install events and the registration event, the token: 12, and the
    # savepoint and release this test's own transaction turns the view's transaction into.
    with django_assert_num_queries(14):
        response = post(client, "/api/v1/register", message, JOIN_TOKEN)
    assert response.status_code == 200, response.content
    node = Node.objects.get(pk=message.node_id)
    assert node.gpus.count() == len(inventory.gpus)
    assert node.filesystems.count() == len({fs.mount for fs in inventory.filesystems})
    assert NodeToken.objects.filter(node=node).exclude(secret_digest="").exists()


def test_a_new_nodes_first_heartbeat_reads_no_row(
    client, django_assert_num_queries, django_capture_on_commit_callbacks
):
    """Its card and its shard list are cached once its registration commits, so a fleet's first beats are warm."""
    with django_capture_on_commit_callbacks(execute=True):
        token = register(client, "gpu-1", gpus=8)
    with django_assert_num_queries(0):
        assert reply_of(heartbeat(client, token, protocol.Heartbeat())).state == "ready"
