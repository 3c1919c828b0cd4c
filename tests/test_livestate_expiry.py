"""Cached cards and shard lists expire at drawn times, so a fleet cached at once does not go cold at once."""

from __future__ import annotations

import pytest

import livestate
from livestate import cards, keeping, shardlists


def assert_spread_over_half_the_ttl(expiries: list[int], ttl: int) -> None:
    assert ttl // 2 <= min(expiries) and max(expiries) <= ttl
    # A fleet's entries stored within one interval leave over most of the spread, not within one interval.
    assert max(expiries) - min(expiries) > 0.4 * ttl
    assert len(set(expiries)) > ttl // 4


@pytest.mark.parametrize(
    "expiry, ttl", [(cards.expiry, cards.CARD_TTL_SECONDS), (shardlists.expiry, shardlists.CACHE_TTL_SECONDS)]
)
def test_entries_cached_together_expire_spread_over_half_the_ttl_and_never_later_than_it(expiry, ttl):
    assert_spread_over_half_the_ttl([expiry() for _ in range(1000)], ttl)


def test_a_keepings_batch_spreads_its_keys_expiries_as_a_draw_would(redis_client):
    ttl = cards.CARD_TTL_SECONDS
    entries = {f"spread-test:{i}": b"x" for i in range(keeping.BATCH)}
    keeping.store(livestate.client(), entries, ttl)
    assert_spread_over_half_the_ttl([redis_client.ttl(key) for key in entries], ttl)
    assert all(redis_client.get(key) == b"x" for key in entries)


def test_a_batch_of_a_few_keys_still_spreads_and_stays_within_the_ttl(redis_client):
    ttl = shardlists.CACHE_TTL_SECONDS
    entries = {f"spread-few:{i}": b"y" for i in range(5)}
    keeping.store(livestate.client(), entries, ttl)
    expiries = [redis_client.ttl(key) for key in entries]
    assert all(ttl // 2 <= e <= ttl for e in expiries)
    assert len(set(expiries)) == len(expiries)
