"""Every node's card is kept in Redis by Celery beat, so that no card expires while the control plane runs.

A fleet back from a partition longer than the cards' TTL, or beating after Redis
lost its data, would otherwise take the cold path (a database read per node) all
at once (issue 25, bench.recovery).
"""

from __future__ import annotations

import pytest

from agent import protocol
from livestate import cards, keys
from nodes.api import cards as node_cards
from nodes.models import NodeToken
from nodes.tasks import keep_cards
from tests.agentapi import JOIN_TOKEN, a_load, heartbeat, register, reply_of

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

    def read_while_changing(node_ids):
        found = node_cards.many_from_database(node_ids)
        for node in node_ids:
            redis_client.incr(keys.generation(node))  # an admin change's bump, after the read
        return found

    expire_cards(redis_client)
    cards.keep(lambda: list(NODES), read_while_changing)
    for node in NODES:
        assert stored(redis_client, node).generation < int(redis_client.get(keys.generation(node)))
