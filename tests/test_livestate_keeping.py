"""Every node's card and shard list are kept in Redis by Celery beat, so that none expires while the control plane runs.

A fleet back from a partition longer than their TTL, or beating after Redis lost
its data, would otherwise take the cold path (database reads per node) all at
once (issue 25, bench.recovery).
"""

from __future__ import annotations

import pytest

from agent import protocol
from inventory import desired
from inventory.models import Shard
from inventory.reconcile import reconcile
from inventory.tasks import keep_shard_lists
from livestate import cards, keeping, keys, shardlists, shardversion
from nodes.api import cards as node_cards
from nodes.models import NodeToken, digest
from nodes.tasks import keep_cards
from tests import factories
from tests.agentapi import JOIN_TOKEN, a_load, heartbeat, register, reply_of
from tests.factories import deployment

pytestmark = [pytest.mark.django_db]

NODES = ("gpu-1", "gpu-2", "gpu-3")


@pytest.fixture
def tokens(client, settings, redis_client):
    settings.LLMGW_JOIN_TOKEN = JOIN_TOKEN
    found = {node: register(client, node, gpus=8) for node in NODES}
    for token in found.values():
        heartbeat(client, token, protocol.Heartbeat(load=a_load()))  # caches its shard list too
    return found


def expire_cards(redis_client) -> None:
    """What a partition longer than the TTL, or a Redis flush, leaves: no card, and no mark of the last keeping."""
    redis_client.delete(*[keys.card(node) for node in NODES], keys.CARDS_KEPT)


def stored(redis_client, node: str) -> cards.NodeCard:
    return cards.decode(redis_client.get(keys.card(node)))


def test_kept_cards_answer_a_fleet_whose_cards_had_expired_without_a_database_read(
    client, tokens, redis_client, django_assert_num_queries
):
    expire_cards(redis_client)
    assert keep_cards() == len(NODES)
    for node, token in tokens.items():
        generation = int(redis_client.get(keys.generation(node)))
        assert stored(redis_client, node) == node_cards.from_database(node, generation)
        with django_assert_num_queries(0):
            assert reply_of(heartbeat(client, token, protocol.Heartbeat(load=a_load()))).state == "ready"


def test_cards_are_kept_once_a_period_and_again_at_once_when_redis_has_lost_them(tokens, redis_client):
    expire_cards(redis_client)
    assert keep_cards() == len(NODES)
    # Kept for a period: a second beat (or a second worker) does nothing.
    assert keep_cards() is None
    assert 0 < redis_client.ttl(keys.CARDS_KEPT) <= cards.KEEP_PERIOD_SECONDS
    # Every kept card outlives the period, so none expires between two keepings.
    assert min(redis_client.ttl(keys.card(node)) for node in NODES) > cards.KEEP_PERIOD_SECONDS
    redis_client.flushdb()
    assert keep_cards() == len(NODES)
    assert {node for node in NODES if redis_client.exists(keys.card(node))} == set(NODES)


def test_a_revoked_token_is_kept_revoked(client, tokens, redis_client):
    NodeToken.objects.filter(node_id="gpu-2").update(secret_digest="")
    expire_cards(redis_client)
    keep_cards()
    assert stored(redis_client, "gpu-2").secret_digest == ""
    assert heartbeat(client, tokens["gpu-2"], protocol.Heartbeat(load=a_load())).status_code == 401


def test_a_change_committed_while_the_cards_are_read_leaves_them_stale_not_wrong(tokens, redis_client):
    """The generations are fetched before the rows are read, as one node's card is (livestate.cards)."""

    def read_while_changing():
        found = node_cards.all_from_database()
        for node in NODES:
            redis_client.incr(keys.generation(node))  # an admin change's bump, after the read
        return found

    expire_cards(redis_client)
    cards.keep(lambda: list(NODES), read_while_changing)
    for node in NODES:
        assert stored(redis_client, node).generation < int(redis_client.get(keys.generation(node)))


def expire_everything(redis_client) -> None:
    """A partition longer than the TTLs: neither cards nor shard lists left, nor the marks of their keeping."""
    expire_cards(redis_client)
    redis_client.delete(*[keys.node_shards(node) for node in NODES], keys.SHARD_LISTS_KEPT)


def test_kept_shard_lists_with_placed_shards_answer_a_returning_fleet_without_a_database_read(
    client, tokens, redis_client, django_assert_num_queries
):
    deployment(gpus_per_shard=4)
    reconcile()
    placed = {node: reply_of(heartbeat(client, token, protocol.Heartbeat())).shards for node, token in tokens.items()}
    assert sum(len(specs) for specs in placed.values()) == Shard.objects.count() > 0
    expire_everything(redis_client)
    assert keep_cards() == keep_shard_lists() == len(NODES)
    for node, token in tokens.items():
        with django_assert_num_queries(0):
            assert reply_of(heartbeat(client, token, protocol.Heartbeat(load=a_load()))).shards == placed[node]


def test_shard_lists_are_kept_once_a_period_and_again_at_once_when_redis_has_lost_them(tokens, redis_client):
    redis_client.delete(keys.SHARD_LISTS_KEPT)
    assert keep_shard_lists() == len(NODES)
    assert keep_shard_lists() is None
    assert min(redis_client.ttl(keys.node_shards(node)) for node in NODES) > shardlists.KEEP_PERIOD_SECONDS
    redis_client.flushdb()
    assert keep_shard_lists() == len(NODES)


def test_a_shard_list_read_while_its_version_moves_is_stored_stale_not_wrong(tokens, redis_client):
    def build_while_placing(node_ids, versions):
        built = desired.cache_entries(node_ids, versions)
        shardversion.bump(None)  # a deployment changed after the read
        return built

    redis_client.delete(keys.SHARD_LISTS_KEPT)
    shardlists.keep(lambda: list(NODES), build_while_placing)
    for node in NODES:
        version, raw = shardlists.read(node)
        assert raw is not None and shardlists.decode(raw, version) is None


def test_kept_shard_lists_of_nodes_without_shards_answer_without_a_database_read(
    client, tokens, redis_client, django_assert_num_queries
):
    expire_everything(redis_client)
    assert keep_cards() == keep_shard_lists() == len(NODES)
    for token in tokens.values():
        with django_assert_num_queries(0):
            reply = reply_of(heartbeat(client, token, protocol.Heartbeat(load=a_load())))
        assert reply.shards == [] and reply.engines == []


def test_a_keeping_reads_every_node_in_one_query_whatever_the_fleet(redis_client, django_assert_num_queries):
    """More nodes than a batch of Redis commands: still the ids, then one query of every row."""
    ids = factories.build(3 * keeping.BATCH + 1, gpus=0, shards=0)
    NodeToken.objects.bulk_create(NodeToken(node_id=node, secret_digest=digest("a secret")) for node in ids)
    redis_client.flushdb()
    with django_assert_num_queries(2):
        assert keep_cards() == len(ids)
    with django_assert_num_queries(2):
        assert keep_shard_lists() == len(ids)
    assert all(redis_client.exists(keys.card(node), keys.node_shards(node)) == 2 for node in ids)
