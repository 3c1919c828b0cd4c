"""`llmgw usage take`'s answer, as the sync reads it: tokens per tenant, model and replica, and streams'
times to first token per model and replica (deploy/gateway_usage.lua writes both)."""

from __future__ import annotations

import re
from pathlib import Path

from gateway.counted import TTFT_BOUNDS, Counted, FirstTokens, parse

LUA = Path(__file__).resolve().parent.parent / "deploy" / "gateway_usage.lua"


def ttft_line(model: str, replica: str, sum_us: int, bucket: int, count: int) -> str:
    counts = [0] * (len(TTFT_BOUNDS) + 1)
    counts[bucket] = count
    return f"ttft {model} {replica} {sum_us} {' '.join(map(str, counts))}"


def test_usage_and_time_to_first_token_lines_are_read_apart():
    answer = "\n".join(
        [
            "acme chat r1 2 10 20",
            ttft_line("chat", "r1", 600_000, 9, 2),
            # A tenant may be called ttft: its line has six fields, a time-to-first-token line 27.
            "ttft chat r1 1 3 4",
            ttft_line("chat", "r2", 7, 0, 1),
            ttft_line("chat", "r2", 3, 0, 1),
            "",
        ]
    )
    taken = parse(answer)
    assert taken.usage == {("acme", "chat", "r1"): Counted(2, 10, 20), ("ttft", "chat", "r1"): Counted(1, 3, 4)}
    assert taken.first_tokens[("chat", "r1")].counts[9] == 2
    assert taken.first_tokens[("chat", "r1")].sum_us == 600_000
    # Two lines for one model and replica (two takes' worth) add up.
    assert taken.first_tokens[("chat", "r2")] == FirstTokens([2] + [0] * len(TTFT_BOUNDS), 10)


def test_lines_that_are_neither_are_skipped():
    answer = "\n".join(
        [
            "Unknown command.",
            "acme chat r1 x 1 2",
            "ttft chat r1 1 2 3 4",  # another number of buckets: not this gateway's
            f"ttft chat r1 -1 {' '.join(['0'] * (len(TTFT_BOUNDS) + 1))}",
        ]
    )
    taken = parse(answer)
    assert taken.usage == {} and taken.first_tokens == {}


def test_the_lua_filter_counts_in_the_same_buckets():
    bounds_us = re.search(r"local BOUNDS_US = \{(.*?)\}", LUA.read_text(), re.S).group(1)
    assert [int(b) / 1e6 for b in bounds_us.replace("\n", " ").split(",") if b.strip()] == list(TTFT_BOUNDS)
