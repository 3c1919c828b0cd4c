"""The database down during agent requests: 503 with Retry-After for what needs it, and working again once back.

The driver fails for real (devstack.faults.database_unreachable), so these run
with transactions committed: the connection is closed and opened again.
"""

import logging

import pytest
from django.db import connection, connections

from agent import protocol
from devstack.faults import database_unreachable
from inventory.models import Node
from livestate import keys, loadstore, selfmetrics, shardlists
from nodes.api import outage
from tests.agentapi import JOIN_TOKEN, a_load, heartbeat, post, register, reply_of
from tests.factories import make_inventory

pytestmark = [pytest.mark.django_db(transaction=True)]


@pytest.fixture(autouse=True)
def _join_token(settings, redis_client):
    settings.LLMGW_JOIN_TOKEN = JOIN_TOKEN
    outage.warn_unavailable.reset()


@pytest.fixture
def token(client):
    return register(client, "gpu-1", gpus=2)


def assert_unavailable(response) -> None:
    assert response.status_code == 503, response.content
    assert response["Retry-After"] == str(outage.RETRY_AFTER_SECONDS)
    rejection = protocol.decode(response.content, protocol.Rejection)
    assert rejection.field == "database"
    assert "database is unavailable" in rejection.reason


def forget_card(redis_client, node_id: str = "gpu-1") -> None:
    """Make the node's next heartbeat read its card from the database."""
    redis_client.delete(keys.card(node_id))


def test_a_heartbeat_whose_card_is_not_cached_gets_503_then_succeeds_once_the_database_is_back(
    client, token, redis_client
):
    forget_card(redis_client)
    beat = protocol.Heartbeat(load=a_load())

    with database_unreachable():
        assert_unavailable(heartbeat(client, token, beat))

    assert reply_of(heartbeat(client, token, beat)).state == "ready"


def test_a_heartbeat_with_an_inventory_gets_503_then_is_stored_once_the_database_is_back(client, token):
    reply_of(heartbeat(client, token, protocol.Heartbeat()))  # caches the card: only the inventory needs the database
    beat = protocol.Heartbeat(inventory=make_inventory("gpu-1.example", gpus=4), inventory_hash="hash-2")

    with database_unreachable():
        assert_unavailable(heartbeat(client, token, beat))

    reply_of(heartbeat(client, token, beat))
    assert Node.objects.get(pk="gpu-1").gpus.count() == 4


def test_a_live_node_with_its_card_cached_keeps_beating_while_the_database_is_down(client, token):
    for _ in range(2):  # the first caches the card, the second the shard list
        reply_of(heartbeat(client, token, protocol.Heartbeat(load=a_load())))

    with database_unreachable():
        reply = reply_of(heartbeat(client, token, protocol.Heartbeat(load=a_load(77.0))))

    assert reply.state == "ready"
    assert loadstore.fetch(["gpu-1"])["gpu-1"].load.cpu_percent == 77.0


def test_registration_gets_503_then_works_once_the_database_is_back(client):
    message = protocol.Register(node_id="gpu-9", inventory=make_inventory("gpu-9.example"), inventory_hash="h")

    with database_unreachable():
        assert_unavailable(post(client, "/api/v1/register", message, JOIN_TOKEN))

    assert not Node.objects.filter(pk="gpu-9").exists()
    register(client, "gpu-9")


def test_the_outage_is_counted_per_heartbeat_and_logged_once(client, token, redis_client, caplog):
    with caplog.at_level(logging.WARNING), database_unreachable():
        for _ in range(3):
            forget_card(redis_client)
            assert_unavailable(heartbeat(client, token, protocol.Heartbeat()))

    counters = selfmetrics.read(redis_client.hgetall(keys.SELF_METRICS))
    assert counters["heartbeats:unavailable"] == 3
    warnings = [r for r in caplog.records if r.name == outage.__name__]
    assert len(warnings) == 1
    assert "database unavailable" in warnings[0].getMessage()
    # Nor does Django log each 503 as it leaves.
    assert [r for r in caplog.records if r.name == "django.request"] == []


def test_an_applied_heartbeat_whose_shard_list_needs_the_database_gets_503_counted_once(client, token, redis_client):
    reply_of(heartbeat(client, token, protocol.Heartbeat()))  # caches the card
    shardlists.forget()  # the shard list must come from the database
    redis_client.delete(keys.SELF_METRICS)

    with database_unreachable():
        # An empty list would tell the agent to stop every shard: no answer is better than that one.
        assert_unavailable(heartbeat(client, token, protocol.Heartbeat()))

    counters = selfmetrics.read(redis_client.hgetall(keys.SELF_METRICS))
    # Its time and load were stored before the shard list was wanted, but the agent was
    # answered 503, and that is what it is counted as, once.
    assert (counters["heartbeats:unavailable"], counters["heartbeat_seconds:count"]) == (1, 1)
    assert "heartbeats:accepted" not in counters


@pytest.mark.skipif(connection.vendor != "postgresql", reason="a server dropping an open connection: PostgreSQL only")
def test_a_connection_the_server_dropped_is_not_used_for_the_next_request(client, token, redis_client):
    connection.ensure_connection()
    other = connections.create_connection("default")
    try:
        with other.cursor() as cursor:
            # As a restart does: the server ends the backend of the connection this process holds.
            cursor.execute("SELECT pg_terminate_backend(%s)", [connection.connection.info.backend_pid])
    finally:
        other.close()
    forget_card(redis_client)

    assert_unavailable(heartbeat(client, token, protocol.Heartbeat()))

    assert reply_of(heartbeat(client, token, protocol.Heartbeat())).state == "ready"
