"""POST /api/v1/heartbeat: what a valid heartbeat changes, and what it must not."""

import time
from datetime import timedelta

import pytest
import time_machine
from django.utils import timezone

from agent import protocol
from inventory.liveness import flush
from inventory.models import AdminState, Liveness, Node, NodeEvent
from livestate import keys, loadstore, selfmetrics
from tests.agentapi import JOIN_TOKEN, a_load, heartbeat, register, reply_of
from tests.factories import make_inventory

pytestmark = [pytest.mark.django_db]


@pytest.fixture(autouse=True)
def _join_token(settings, redis_client):
    settings.LLMGW_JOIN_TOKEN = JOIN_TOKEN


@pytest.fixture
def token(client):
    return register(client, "gpu-1", gpus=8)


def test_a_heartbeat_stores_its_load_in_redis_with_the_arrival_time(client, token):
    before = time.time()
    beat = protocol.Heartbeat(load=a_load(42.0), sent_at=1000.0)  # the agent's clock is far off

    reply = reply_of(heartbeat(client, token, beat))

    stored = loadstore.fetch(["gpu-1"])["gpu-1"]
    assert stored.load == beat.load
    assert before <= stored.received_at <= time.time()
    assert reply.state == "ready"
    assert reply.inventory_wanted is False
    assert reply.shards == [], "nothing placed on it"


def test_the_reply_gives_the_configured_interval(client, token, settings):
    settings.LLMGW_HEARTBEAT_INTERVAL = 7.5
    assert reply_of(heartbeat(client, token, protocol.Heartbeat())).heartbeat_interval == 7.5


def test_an_unchanged_heartbeat_touches_no_database_row_until_the_flush(
    client, token, django_assert_num_queries, redis_client
):
    Node.objects.filter(pk="gpu-1").update(last_heartbeat=timezone.now() - timedelta(seconds=20))
    heartbeat(client, token, protocol.Heartbeat(load=a_load()))  # caches the node's card

    with django_assert_num_queries(0):
        reply_of(heartbeat(client, token, protocol.Heartbeat(load=a_load(), inventory_hash="hash-1")))

    assert Node.objects.get(pk="gpu-1").last_heartbeat < timezone.now() - timedelta(seconds=19)
    assert flush().times == 1
    assert timezone.now() - Node.objects.get(pk="gpu-1").last_heartbeat < timedelta(seconds=5)
    assert not redis_client.exists(keys.HEARTBEATS)


def test_the_flush_never_moves_a_heartbeat_time_back(client, token):
    heartbeat(client, token, protocol.Heartbeat())
    later = timezone.now() + timedelta(seconds=30)
    Node.objects.filter(pk="gpu-1").update(last_heartbeat=later)

    flush()

    assert Node.objects.get(pk="gpu-1").last_heartbeat == later


def test_a_token_cannot_write_another_node(client, token):
    other = register(client, "gpu-2", gpus=2)
    other_secret = other.rpartition(".")[2]
    # The body cannot name a node (unknown fields are ignored)…
    body = b'{"node_id": "gpu-2", "load": {"cpu_percent": 99, "cpus": 1}}'
    reply_of(heartbeat(client, token, body))
    assert set(loadstore.fetch(["gpu-1", "gpu-2"])) == {"gpu-1"}
    # …and a secret proves only the node it was issued to.
    response = heartbeat(client, f"gpu-1.{other_secret}", protocol.Heartbeat(load=a_load()))
    assert response.status_code == 401
    response = heartbeat(client, f"gpu-2.{token.rpartition('.')[2]}", protocol.Heartbeat(load=a_load()))
    assert response.status_code == 401
    assert set(loadstore.fetch(["gpu-1", "gpu-2"])) == {"gpu-1"}


@pytest.mark.parametrize("admin_state", [AdminState.CORDONED, AdminState.DRAINING])
def test_an_inventory_replaces_the_hardware_and_keeps_the_admin_state(client, token, admin_state):
    Node.objects.filter(pk="gpu-1").update(admin_state=admin_state, notes="keep me")
    inventory = make_inventory("gpu-1.example", gpus=2, gpu_name="NVIDIA A100-SXM4-40GB")

    reply = reply_of(heartbeat(client, token, protocol.Heartbeat(inventory=inventory, inventory_hash="hash-2")))

    node = Node.objects.get(pk="gpu-1")
    assert sorted(node.gpus.values_list("index", flat=True)) == [0, 1]
    assert node.inventory_hash == "hash-2"
    assert node.admin_state == admin_state
    assert node.notes == "keep me"
    assert reply.state == admin_state.value
    assert reply.inventory_wanted is False


def test_a_changed_inventory_hash_asks_for_the_inventory(client, token):
    reply = reply_of(heartbeat(client, token, protocol.Heartbeat(inventory_hash="hash-new")))
    assert reply.inventory_wanted is True
    inventory = make_inventory("gpu-1.example", gpus=1)
    heartbeat(client, token, protocol.Heartbeat(inventory=inventory, inventory_hash="hash-new"))
    reply = reply_of(heartbeat(client, token, protocol.Heartbeat(inventory_hash="hash-new")))
    assert reply.inventory_wanted is False


@pytest.mark.parametrize("liveness", [Liveness.UNREACHABLE, Liveness.LOST])
def test_a_heartbeat_brings_a_silent_node_back_at_once_keeping_its_cordon(
    client, token, liveness, operator, django_assert_num_queries
):
    from inventory.liveness import change_liveness
    from inventory.operator import set_admin_state

    set_admin_state(Node.objects.get(pk="gpu-1"), AdminState.CORDONED, operator, "maintenance")
    heartbeat(client, token, protocol.Heartbeat())  # a cached card saying alive and cordoned
    change_liveness("gpu-1", Liveness.ALIVE, liveness, "test", timezone.now())

    # The change of liveness left the card current: the heartbeat asks the database nothing.
    with django_assert_num_queries(0):
        reply = reply_of(heartbeat(client, token, protocol.Heartbeat()))
    # The reply says alive at once; the database hears of it with the next flush, in bulk.
    assert Node.objects.get(pk="gpu-1").liveness == liveness
    flush()

    node = Node.objects.get(pk="gpu-1")
    assert node.liveness == Liveness.ALIVE
    assert node.admin_state == AdminState.CORDONED
    assert reply.state == "cordoned"
    event = NodeEvent.objects.filter(node=node, kind=NodeEvent.Kind.LIVENESS).first()
    assert (event.from_state, event.to_state) == (liveness, Liveness.ALIVE)


def test_an_operator_change_reaches_the_next_reply(client, token, operator):
    from inventory.operator import set_admin_state

    assert reply_of(heartbeat(client, token, protocol.Heartbeat())).state == "ready"
    set_admin_state(Node.objects.get(pk="gpu-1"), AdminState.DRAINING, operator, "maintenance")
    assert reply_of(heartbeat(client, token, protocol.Heartbeat())).state == "draining"


def test_load_older_than_the_limit_is_not_fresh(client, token, settings):
    settings.LLMGW_LOAD_MAX_AGE = 60
    with time_machine.travel(time.time(), tick=False) as traveller:
        heartbeat(client, token, protocol.Heartbeat(load=a_load(10.0)))
        traveller.shift(59)
        assert loadstore.fetch(["gpu-1"])["gpu-1"].load.cpu_percent == 10.0
        traveller.shift(2)
        assert loadstore.fetch(["gpu-1"]) == {}
        heartbeat(client, token, protocol.Heartbeat(load=a_load(20.0)))
        assert loadstore.fetch(["gpu-1"])["gpu-1"].load.cpu_percent == 20.0


def test_heartbeats_are_counted_by_outcome(client, token, redis_client):
    heartbeat(client, token, protocol.Heartbeat())
    heartbeat(client, token, b'{"load": {"cpu_percent": 101, "cpus": 1}}')
    heartbeat(client, "gpu-1.wrong", protocol.Heartbeat())

    counters = selfmetrics.read(redis_client.hgetall(keys.SELF_METRICS))
    assert counters["heartbeats:accepted"] == 1
    assert counters["heartbeats:invalid"] == 1
    assert counters["heartbeats:unauthorized"] == 1
    assert counters["heartbeat_seconds:count"] == 3


def test_placed_shards_reach_the_agent_and_its_reports_move_them(client, token, django_assert_num_queries):
    from inventory.models import ReplicaState, Shard
    from inventory.reconcile import reconcile
    from tests.factories import deployment

    reply_of(heartbeat(client, token, protocol.Heartbeat()))  # the card is cached from now on
    deployment()
    reconcile()
    # Applied in Redis, its shard list read from the database and cached under the version the script saw.
    (spec,) = reply_of(heartbeat(client, token, protocol.Heartbeat())).shards
    assert spec.shard == Shard.objects.get().shard_id
    running = [protocol.ShardStatus(shard=spec.shard, state="running", pid=42, metrics_port=9100)]
    assert reply_of(heartbeat(client, token, protocol.Heartbeat(shards=running))).shards == [spec]
    assert Shard.objects.get().state == ReplicaState.RUNNING
    reply_of(heartbeat(client, token, protocol.Heartbeat(shards=running)))  # the report moved the version
    with django_assert_num_queries(0):
        assert reply_of(heartbeat(client, token, protocol.Heartbeat(shards=running))).shards == [spec]


def test_the_reply_asks_for_the_engines_of_the_placed_shards_from_the_cache_too(
    client, token, django_assert_num_queries
):
    from inventory.reconcile import reconcile
    from tests.factories import deployment

    reply_of(heartbeat(client, token, protocol.Heartbeat()))  # the card is cached from now on
    assert reply_of(heartbeat(client, token, protocol.Heartbeat())).engines == []
    deployment(engine="vllm", gpus_per_shard=1)
    deployment("demo", engine="demo", gpus_per_shard=1)
    reconcile()
    want = [protocol.EngineWant(engine="vllm", variant="cuda")]
    # The first beat after placement reads the database and caches the list; the next costs no query.
    assert reply_of(heartbeat(client, token, protocol.Heartbeat())).engines == want
    with django_assert_num_queries(0):
        assert reply_of(heartbeat(client, token, protocol.Heartbeat())).engines == want
