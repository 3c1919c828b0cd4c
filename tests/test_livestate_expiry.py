"""Cached cards and shard lists expire at drawn times, so a fleet cached at once does not go cold at once."""

from __future__ import annotations

import pytest

from livestate import cards, shardlists


@pytest.mark.parametrize(
    "expiry, ttl", [(cards.expiry, cards.CARD_TTL_SECONDS), (shardlists.expiry, shardlists.CACHE_TTL_SECONDS)]
)
def test_entries_cached_together_expire_spread_over_half_the_ttl_and_never_later_than_it(expiry, ttl):
    drawn = [expiry() for _ in range(1000)]
    assert ttl // 2 <= min(drawn) and max(drawn) <= ttl
    # A fleet's entries stored within one interval leave over most of the spread, not within one interval.
    assert max(drawn) - min(drawn) > 0.4 * ttl
    assert len(set(drawn)) > ttl // 4
