"""A status's detail keeps the end of a log, the part with the error, within the protocol's limit."""

from __future__ import annotations

from agent import protocol
from agent.details import LINE_CHARS, with_last_lines


def test_the_last_lines_are_kept_in_order_and_the_first_ones_dropped_when_room_runs_out():
    lines = [f"line {i:04d}" for i in range(1000)]
    detail = with_last_lines("exit 2", lines)
    assert len(detail) <= protocol.MAX_DETAIL
    head, *kept = detail.split("\n")
    assert head == "exit 2"
    assert kept == lines[-len(kept) :] and 0 < len(kept) < len(lines)


def test_a_long_line_is_cut_so_one_line_cannot_take_all_the_room():
    detail = with_last_lines("exit 1", ["x" * 10_000, "the error"])
    assert detail == "\n".join(["exit 1", "x" * LINE_CHARS, "the error"])
