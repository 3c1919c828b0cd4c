"""After Redis lost its data, the first heartbeat to find no card refills every card and shard list at once.

Celery's keepers would refill them within a second or two, but they yield the cores to the web tier, and a
whole fleet on the cold path fills the cores (issue 25, `bench.recovery --cases redis-restart-empty`). So the
heartbeat path starts the same keepings in its own worker (inventory/refill.py), once per loss.
"""

from __future__ import annotations

import gc
import threading

import pytest

from agent import protocol
from devstack.polling import wait_until
from inventory import refill
from livestate import beatscript, cards, keys, shardlists
from nodes.api import cards as node_cards
from nodes.models import split_token
from tests.agentapi import JOIN_TOKEN, a_load, heartbeat, register, reply_of

NODES = ("gpu-1", "gpu-2", "gpu-3", "gpu-4")


@pytest.fixture
def tokens(client, settings, redis_client):
    settings.LLMGW_JOIN_TOKEN = JOIN_TOKEN
    found = {node: register(client, node, gpus=8) for node in NODES}
    for token in found.values():
        heartbeat(client, token, protocol.Heartbeat(load=a_load()))
    return found


@pytest.fixture
def refill_on(settings, monkeypatch):
    settings.LLMGW_REFILL_AFTER_LOSS = True
    # Each test's loss is a new one, whatever an earlier test tried a moment ago.
    monkeypatch.setattr(refill, "_last_try", float("-inf"))


def verdict_of(token: str) -> beatscript.Verdict:
    node_id, secret = split_token(token)
    return beatscript.run(node_id, secret, token, "10.0.0.7", 1_000.0, apply=True)


def refill_threads() -> list[threading.Thread]:
    return [thread for thread in threading.enumerate() if thread.name == "llmgw-refill"]


@pytest.mark.django_db
def test_a_stale_card_says_whether_the_cards_were_lost_with_redis(tokens, redis_client):
    node_cards.keep_all()
    # One card gone (a node's token changed): the cards as a whole were not lost.
    redis_client.delete(keys.card("gpu-1"))
    assert verdict_of(tokens["gpu-1"]).outcome == beatscript.STALE
    assert not verdict_of(tokens["gpu-1"]).cards_lost
    # Redis emptied: no keeping has filled the cards since.
    redis_client.flushdb()
    verdict = verdict_of(tokens["gpu-1"])
    assert verdict.outcome == beatscript.STALE
    assert verdict.cards_lost


@pytest.mark.django_db(transaction=True)
def test_the_first_heartbeat_after_redis_lost_its_data_refills_every_card_and_shard_list(
    client, tokens, redis_client, refill_on
):
    redis_client.flushdb()
    assert reply_of(heartbeat(client, tokens["gpu-1"], protocol.Heartbeat(load=a_load()))).state == "ready"
    # The other nodes' cards and shard lists come back without a heartbeat of theirs.
    wait_until(lambda: redis_client.exists(keys.CARDS_FILLED), 10, "the refill's cards")
    wait_until(lambda: redis_client.exists(keys.SHARD_LISTS_KEPT), 10, "the refill's shard lists")
    wait_until(lambda: not refill_threads(), 10, "the refill's end")
    for node in NODES:
        generation = int(redis_client.get(keys.generation(node)) or 0)
        assert cards.decode(redis_client.get(keys.card(node))) == node_cards.from_database(node, generation)
        assert redis_client.exists(keys.node_shards(node)), node
    # Stored under the current shard version: an ordinary heartbeat reads it.
    assert shardlists.KEEP_PERIOD_SECONDS >= redis_client.ttl(keys.SHARD_LISTS_KEPT) > 0


@pytest.mark.django_db(transaction=True)
def test_a_card_gone_alone_starts_no_refill(client, tokens, redis_client, refill_on):
    node_cards.keep_all()
    redis_client.delete(keys.card("gpu-2"), keys.CARDS_KEPT)
    assert reply_of(heartbeat(client, tokens["gpu-2"], protocol.Heartbeat(load=a_load()))).state == "ready"
    # A refill would have been started before the answer, and would take the keeping's mark.
    wait_until(lambda: not refill_threads(), 10, "no refill running")
    assert not redis_client.exists(keys.CARDS_KEPT)


@pytest.mark.django_db(transaction=True)
def test_a_worker_starts_one_refill_a_second_at_most(redis_client, refill_on):
    calls: list[int] = []
    release = threading.Event()

    def keep_cards() -> int | None:
        calls.append(1)
        release.wait(10)
        return None

    for _ in range(5):
        refill.after_loss(keep_cards)
    wait_until(lambda: bool(calls), 10, "the first refill")
    release.set()
    wait_until(lambda: not refill_threads(), 10, "the refill's end")
    assert len(calls) == 1


@pytest.mark.django_db
def test_the_refill_runs_without_the_cyclic_collector_and_restores_it_however_it_ends(redis_client, monkeypatch):
    seen = []

    def keep_cards() -> int:
        seen.append(gc.isenabled())
        return 0

    refill.refill(keep_cards)
    assert seen == [False]
    assert gc.isenabled()

    def failing() -> int:
        raise RuntimeError("the database went away")

    refill.refill(failing)  # logged, not raised
    assert gc.isenabled()
