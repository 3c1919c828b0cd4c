"""bench.recovery's cases read second by second: when the fleet is back, and what counts against it."""

from __future__ import annotations

from array import array

from bench.fleetlib.disruptions import per_second, per_tenth, summarize
from bench.fleetlib.pacer import PhaseStats

START = 1000.0


def stats_of(
    beats: list[tuple[float, float | None]], unsent: tuple[float, ...] = (), late: tuple[float, ...] = ()
) -> PhaseStats:
    """Beats as (seconds after START they were due, latency or None if never answered)."""
    stats = PhaseStats("case")
    for at, latency in beats:
        stats.offered_due.append(START + at)
        if latency is not None:
            stats.due_times.append(START + at)
            stats.latencies.append(latency)
    for at in unsent:
        stats.offered_due.append(START + at)
    stats.unsent_due = array("d", [START + at for at in unsent])
    stats.late_due = array("d", [START + at for at in late])
    return stats


def test_each_second_counts_its_due_answered_late_unsent_and_failed_beats():
    stats = stats_of([(0.1, 0.01), (0.5, 0.9), (0.7, None), (1.2, 0.02)], unsent=(0.8,), late=(0.5,))
    rows = per_second(stats, START, 3, flaps=[1.5, -4.0])
    assert rows[0] == {"second": 0, "due": 4, "answered": 2, "p99_ms": 10.0, "not_in_time": 2, "failed": 1, "flaps": 0}
    assert rows[1] == {"second": 1, "due": 1, "answered": 1, "p99_ms": 20.0, "not_in_time": 0, "failed": 0, "flaps": 1}
    assert rows[2]["due"] == 0 and rows[2]["p99_ms"] is None


def test_the_fleet_is_back_after_its_last_degraded_second():
    healthy = [(s + 0.5, 0.01) for s in range(10) for _ in range(100)]
    slow = [(2.5, 0.4)] * 100  # second 2: p99 over 250 ms
    rows = per_second(stats_of(healthy + slow), START, 10, flaps=[])
    summary = summarize("flushed", rows, interval=5.0, note="", marked_before=3)
    assert summary["back_after_s"] == 3
    assert summary["degraded_seconds"] == 1
    assert summary["back_within_one_interval"] is True
    assert summary["worst_second_p99_ms"] == 400.0
    assert summary["marked_unreachable_before"] == 3


def test_a_flap_or_a_beat_not_sent_in_time_is_degraded_however_fast_the_rest():
    healthy = [(s + 0.5, 0.01) for s in range(10) for _ in range(100)]
    rows = per_second(stats_of(healthy, unsent=(7.5,)), START, 10, flaps=[8.2])
    summary = summarize("partition", rows, interval=5.0, note="")
    assert summary["back_after_s"] == 9
    assert summary["back_within_one_interval"] is False
    assert (summary["not_in_time"], summary["flaps"]) == (1, 1)


def test_the_first_seconds_are_told_a_tenth_at_a_time_by_due_time():
    # A queue that built in the first tenths and drained: each tenth's beats wait less than the last's.
    queue = [(0.05, 0.30), (0.05, 0.31), (0.05, 0.32), (0.15, 0.20), (0.95, 0.01), (1.5, 0.002)]
    beats = [(-0.05, 5.0), *queue, (2.5, 9.0)]
    tenths = per_tenth(stats_of(beats, unsent=(0.06,)), START, seconds=2)
    assert len(tenths) == 20
    assert tenths[0] == {"from_s": 0.0, "answered": 3, "p50_ms": 310.0, "p99_ms": 310.0, "max_ms": 320.0}
    assert tenths[1]["p99_ms"] == 200.0 and tenths[9]["max_ms"] == 10.0
    assert tenths[2] == {"from_s": 0.2, "answered": 0, "p50_ms": None, "p99_ms": None, "max_ms": None}
    # Beats due before the disruption or after the tenths told are left out.
    assert sum(t["answered"] for t in tenths) == 6
