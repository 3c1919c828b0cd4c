"""Redis stopped during heartbeats: answers go on from the database, and Redis is used again once back."""

import logging
from datetime import timedelta

import pytest
from django.utils import timezone

import livestate
from agent import protocol
from devstack.redis_server import RedisServer
from inventory import liveness
from inventory.models import Liveness, Node
from livestate import loadstore
from nodes.api import heartbeats
from nodes.models import NodeToken
from tests.agentapi import JOIN_TOKEN, a_load, heartbeat, register, reply_of
from tests.factories import make_inventory

pytestmark = [pytest.mark.django_db, pytest.mark.slow]


@pytest.fixture
def private_redis(settings, tmp_path):
    """A redis-server of this test's own, so stopping it disturbs no other test."""
    server = RedisServer(tmp_path / "redis").start()
    settings.REDIS_URL = server.url
    settings.LLMGW_JOIN_TOKEN = JOIN_TOKEN
    livestate.reset_client()
    heartbeats._warn_redis_down.reset()
    yield server
    server.stop()
    livestate.reset_client()


def test_heartbeats_are_answered_while_redis_is_down_and_redis_is_used_again_when_back(
    client, private_redis, caplog, django_assert_num_queries
):
    tokens = {name: register(client, name, gpus=2) for name in ("gpu-1", "gpu-2", "gpu-3")}
    for token in tokens.values():
        reply_of(heartbeat(client, token, protocol.Heartbeat(load=a_load())))
    assert len(loadstore.fetch(tokens)) == 3
    Node.objects.filter(pk="gpu-3").update(liveness=Liveness.UNREACHABLE)
    inventory_before = list(Node.objects.get(pk="gpu-2").gpus.values_list("uuid", flat=True))

    private_redis.stop()
    outage_started = timezone.now()
    with caplog.at_level(logging.WARNING, logger="nodes.api.heartbeats"):
        replies = {
            name: reply_of(heartbeat(client, token, protocol.Heartbeat(load=a_load())))
            for name, token in tokens.items()
        }
        reply_of(heartbeat(client, tokens["gpu-1"], protocol.Heartbeat(load=a_load())))
    # Liveness goes to the database directly, a silent node comes back, and the log says why once.
    for name in tokens:
        assert Node.objects.get(pk=name).last_heartbeat >= outage_started
    assert Node.objects.get(pk="gpu-3").liveness == Liveness.ALIVE
    assert {reply.state for reply in replies.values()} == {"ready"}
    assert len([r for r in caplog.records if "Redis unavailable" in r.getMessage()]) == 1
    # A new inventory is stored, the old one was not lost, and a revoked token is still refused.
    inventory = make_inventory("gpu-1.example", gpus=4)
    reply_of(heartbeat(client, tokens["gpu-1"], protocol.Heartbeat(inventory=inventory, inventory_hash="h2")))
    assert Node.objects.get(pk="gpu-1").gpus.count() == 4
    assert list(Node.objects.get(pk="gpu-2").gpus.values_list("uuid", flat=True)) == inventory_before
    NodeToken.objects.get(node_id="gpu-2").revoke("operator")
    assert heartbeat(client, tokens["gpu-2"], protocol.Heartbeat()).status_code == 401
    # The sweep runs without Redis and finds every node that beat alive.
    swept = liveness.mark_stale(timezone.now() + timedelta(seconds=5))
    assert swept.unreachable == []

    private_redis.start()
    before_recovery = Node.objects.get(pk="gpu-1").last_heartbeat
    reply_of(heartbeat(client, tokens["gpu-1"], protocol.Heartbeat(load=a_load(55.0))))
    with django_assert_num_queries(0):
        reply_of(heartbeat(client, tokens["gpu-1"], protocol.Heartbeat(load=a_load(66.0))))
    assert loadstore.fetch(["gpu-1"])["gpu-1"].load.cpu_percent == 66.0
    assert liveness.flush().times == 1
    assert Node.objects.get(pk="gpu-1").last_heartbeat > before_recovery
