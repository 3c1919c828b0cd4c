"""inventory.heartbeat: the one action a heartbeat is handed to, called as the web layer calls it."""

from __future__ import annotations

import ast
import time
from pathlib import Path

import pytest
import redis
from django.db import connection
from django.test.utils import CaptureQueriesContext

from agent import protocol
from inventory import heartbeat
from inventory.models import Liveness, Node
from livestate import cards, keys, loadstore, selfmetrics
from nodes.api.cards import keep_all, proven
from nodes.models import NodeToken, split_token
from tests.agentapi import JOIN_TOKEN, a_load, register
from tests.factories import make_inventory

pytestmark = [pytest.mark.django_db]

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(autouse=True)
def _join_token(settings, redis_client):
    settings.LLMGW_JOIN_TOKEN = JOIN_TOKEN


@pytest.fixture
def token(client):
    return register(client, "gpu-1", gpus=2)


def sender(token: str, address: str = "10.0.0.7") -> heartbeat.Sender:
    node_id, secret = split_token(token)
    return heartbeat.Sender(node_id, secret, token, address, proven, keep_all)


def receive(token: str, beat: protocol.Heartbeat, address: str = "10.0.0.7") -> protocol.HeartbeatReply:
    return heartbeat.receive(sender(token, address), beat, time.time(), time.perf_counter())


def test_a_heartbeat_whose_card_is_cached_reads_and_writes_no_row(token, redis_client, django_assert_num_queries):
    receive(token, protocol.Heartbeat(load=a_load()))  # the card, read from the database, is cached

    with django_assert_num_queries(0):
        reply = receive(token, protocol.Heartbeat(load=a_load(55.0)))

    assert reply.state == "ready"
    assert redis_client.hexists(keys.HEARTBEATS, "gpu-1")
    assert loadstore.fetch(["gpu-1"])["gpu-1"].load.cpu_percent == 55.0


def test_a_wrong_secret_is_refused_and_says_whether_the_script_counted_it(token, redis_client):
    node_id, _ = split_token(token)
    wrong = f"{node_id}.not-the-secret"

    with pytest.raises(heartbeat.WrongToken) as from_database:
        receive(wrong, protocol.Heartbeat())
    assert from_database.value.counted is False, "no card cached: the web layer counts it"

    receive(token, protocol.Heartbeat())  # caches the card
    with pytest.raises(heartbeat.WrongToken) as from_script:
        receive(wrong, protocol.Heartbeat())
    assert from_script.value.counted is True


def test_a_heartbeat_no_newer_than_one_received_is_refused_whichever_path(token):
    receive(token, protocol.Heartbeat(boot_id="run-1", seq=5))
    with pytest.raises(heartbeat.Replayed) as by_script:
        receive(token, protocol.Heartbeat(boot_id="run-1", seq=5))
    assert (by_script.value.seq, by_script.value.newest) == (5, 5)

    cards.invalidate("gpu-1")  # the card is read from the database, the sequence checked after
    with pytest.raises(heartbeat.Replayed) as after_database:
        receive(token, protocol.Heartbeat(boot_id="run-1", seq=4))
    assert (after_database.value.seq, after_database.value.newest) == (4, 5)


def test_every_accepted_heartbeat_is_counted_once_on_every_path(token, redis_client, monkeypatch):
    # The ordinary heartbeat's count is held for up to a second; here it is sent at once.
    monkeypatch.setattr(heartbeat, "_tally", selfmetrics.Tally(every=0))
    redis_client.delete(keys.SELF_METRICS)

    receive(token, protocol.Heartbeat(load=a_load()))  # the card from the database
    receive(token, protocol.Heartbeat(load=a_load()))  # applied by the script
    receive(token, protocol.Heartbeat(inventory=make_inventory("gpu-1.example", gpus=1), inventory_hash="hash-2"))

    counters = selfmetrics.read(redis_client.hgetall(keys.SELF_METRICS))
    assert (counters["heartbeats:accepted"], counters["heartbeat_seconds:count"]) == (3, 3)


def test_an_inventory_records_where_it_came_from_and_a_non_address_records_nothing(token):
    receive(
        token, protocol.Heartbeat(inventory=make_inventory("gpu-1.example"), inventory_hash="h2"), "2001:DB8:0::0001"
    )
    assert Node.objects.get(pk="gpu-1").source_addr == "2001:db8::1"

    receive(token, protocol.Heartbeat(inventory=make_inventory("gpu-1.example"), inventory_hash="h3"), "unknown")
    assert Node.objects.get(pk="gpu-1").source_addr == "2001:db8::1"


def test_a_lost_node_is_answered_alive_at_once_and_revived_by_the_flush(token):
    receive(token, protocol.Heartbeat())
    Node.objects.filter(pk="gpu-1").update(liveness=Liveness.LOST)
    cards.invalidate("gpu-1")

    assert receive(token, protocol.Heartbeat()).state == "ready"
    assert Node.objects.get(pk="gpu-1").liveness == Liveness.LOST, "the sweep's flush writes the revival"


def test_a_node_just_registered_finds_its_card_cached_and_its_old_token_is_refused_by_the_script(
    client, django_capture_on_commit_callbacks
):
    with django_capture_on_commit_callbacks(execute=True):
        old = register(client, "gpu-2")
    with django_capture_on_commit_callbacks(execute=True):
        new = register(client, "gpu-2")  # registering again issues a new token and caches the card anew

    with CaptureQueriesContext(connection) as first_beat:
        assert receive(new, protocol.Heartbeat(load=a_load())).state == "ready"
    # No card read, nor the node's shards: the registration cached both.
    assert first_beat.captured_queries == []
    with pytest.raises(heartbeat.WrongToken) as refused:
        receive(old, protocol.Heartbeat())
    assert refused.value.counted is True, "refused by the beat script, against the cached card"


def test_a_stale_card_is_read_again_but_a_current_shard_list_is_used_as_cached(token):
    receive(token, protocol.Heartbeat(load=a_load()))  # the card and the shard list are cached
    cards.invalidate("gpu-1")

    with CaptureQueriesContext(connection) as beat:
        assert receive(token, protocol.Heartbeat(load=a_load())).state == "ready"
    # The card's query only: the beat script handed back the shard list with its verdict.
    assert [q["sql"].split(" FROM ")[1].split()[0].strip('"') for q in beat.captured_queries] == [
        NodeToken._meta.db_table
    ]


def test_redis_failing_after_admission_still_revives_a_node_whose_cached_card_says_alive(token, monkeypatch):
    receive(token, protocol.Heartbeat())  # the card, alive, is cached
    # The sweep marked it unreachable; changes of liveness leave the card current, saying alive.
    Node.objects.filter(pk="gpu-1").update(liveness=Liveness.UNREACHABLE)

    def redis_gone(*args, **kwargs):
        raise redis.ConnectionError("Redis went away after the beat script ran")

    monkeypatch.setattr(heartbeat.heartbeats, "record", redis_gone)
    beat = protocol.Heartbeat(inventory=make_inventory("gpu-1.example", gpus=2), inventory_hash="h2")
    assert receive(token, beat).state == "ready"
    assert Node.objects.get(pk="gpu-1").liveness == Liveness.ALIVE, "written to the database, as Redis could not be"


@pytest.mark.parametrize("module", ["nodes/api/views.py", "nodes/api/fastpath.py"])
def test_the_web_layer_reaches_a_heartbeat_only_through_its_action(module):
    tree = ast.parse((ROOT / module).read_text())
    imported = {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
    imported |= {
        f"{node.module}.{alias.name}"
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom)
        for alias in node.names
    }
    below = {name for name in imported if name.split(".")[0] in ("inventory", "livestate")}
    assert below <= {"inventory.heartbeat"}, f"{module} imports {below}"


def test_the_sequence_is_checked_after_the_database_even_when_redis_forgot_its_scripts(token, redis_client):
    receive(token, protocol.Heartbeat(boot_id="run-1", seq=5))
    redis_client.script_flush()
    cards.invalidate("gpu-1")

    with pytest.raises(heartbeat.Replayed):
        receive(token, protocol.Heartbeat(boot_id="run-1", seq=5))
    assert receive(token, protocol.Heartbeat(boot_id="run-1", seq=6)).state == "ready"


def test_a_heartbeat_after_redis_lost_its_data_writes_back_all_the_next_one_needs(
    token, redis_client, monkeypatch, django_assert_num_queries
):
    monkeypatch.setattr(heartbeat, "_tally", selfmetrics.Tally(every=0))
    receive(token, protocol.Heartbeat(load=a_load()))
    redis_client.flushdb()

    # Its card and its shards from the database; what the script could not write, in one script call.
    with django_assert_num_queries(2):
        assert receive(token, protocol.Heartbeat(boot_id="run-1", seq=1, load=a_load(33.0))).state == "ready"

    assert redis_client.hexists(keys.HEARTBEATS, "gpu-1")
    assert loadstore.fetch(["gpu-1"])["gpu-1"].load.cpu_percent == 33.0
    assert b"33" in redis_client.get(keys.load_lines("gpu-1"))
    assert 0 < redis_client.ttl(keys.card("gpu-1")) <= cards.CARD_TTL_SECONDS
    assert redis_client.exists(keys.node_shards("gpu-1"))
    counters = redis_client.hgetall(keys.SELF_METRICS)
    assert counters[b"heartbeats:accepted"] == b"1", "an integer count stays an integer"
    assert 0 < float(counters[b"heartbeat_seconds:sum"]) < 60
    # So the next heartbeat is the ordinary one: no row read, applied by the beat script.
    with django_assert_num_queries(0):
        receive(token, protocol.Heartbeat(boot_id="run-1", seq=2, load=a_load(44.0)))
    assert loadstore.fetch(["gpu-1"])["gpu-1"].load.cpu_percent == 44.0
    with pytest.raises(heartbeat.Replayed):
        receive(token, protocol.Heartbeat(boot_id="run-1", seq=2))
