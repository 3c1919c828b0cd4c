"""Load from fixture /proc trees whose counters are known (tests/agent/fixtures/proc → proc-later).

Between the two trees: user 1800, nice 200, system 600, irq 200, softirq 200 (busy 3000),
idle 700, iowait 200, steal 100 (total 4000) and guest 500 ticks, which user already holds;
uptime advances 10 s. Group 1000: pid 1000 +400 ticks, pid 1001 +300, pid 1002 exited,
pid 1003 reused by a new process with 150 ticks, pid 1004 born with 50, pid 1005 (in
the engine's session 1000 but a process group of its own) +200; group 2000: pid 2000 +500.
pid_max is 4096 and the last pid handed out moves from 2000 to 1004, wrapping once.
"""

import logging
import shutil
from pathlib import Path

import pytest

from agent import procfs
from agent.descendants import Descendants
from agent.load import Sampler

FIXTURES = Path(__file__).parent / "fixtures"
PAGE = 4096


@pytest.fixture
def proc(tmp_path):
    root = tmp_path / "proc"
    shutil.copytree(FIXTURES / "proc", root)
    return root


def advance(root: Path) -> None:
    shutil.rmtree(root)
    shutil.copytree(FIXTURES / "proc-later", root)


def two_samples(root: Path, groups: dict[str, int]):
    sampler = Sampler(root, clock_ticks=100, page_size=PAGE)
    assert sampler.sample(groups) is None, "the first reading is only a baseline"
    advance(root)
    return sampler, sampler.sample(groups)


def test_cpu_percent_is_busy_over_total_of_the_interval(proc):
    _, load = two_samples(proc, {})
    assert load.cpu_percent == pytest.approx(100 * 3000 / 4000)
    assert load.cpus == 4
    assert load.interval_seconds == pytest.approx(10.0)


def test_memory_and_load_averages(proc):
    _, load = two_samples(proc, {})
    assert load.memory_used_bytes == (16384000 - 12288000) * 1024
    assert load.memory_available_bytes == 12288000 * 1024
    assert (load.load1, load.load5, load.load15) == (1.50, 1.25, 0.75)


def test_shard_cores_and_rss_from_process_group_deltas(proc):
    _, load = two_samples(proc, {"a": 1000, "b": 2000})
    by_shard = {s.shard: s for s in load.shards}
    # 400 + 300 + 150 (new process on a reused pid) + 50 (born) + 200 (left the group, not the engine)
    # ticks over 10 s.
    assert by_shard["a"].cpu_cores == pytest.approx(1100 / 100 / 10)
    assert by_shard["a"].rss_bytes == (25600 + 12800 + 2000 + 3000 + 1000) * PAGE
    assert by_shard["b"].cpu_cores == pytest.approx(500 / 100 / 10)
    assert by_shard["b"].rss_bytes == 1000 * PAGE


def test_a_reused_pid_is_not_subtracted_from_the_old_process(proc):
    sampler = Sampler(proc, clock_ticks=100, page_size=PAGE)
    sampler.sample({"a": 1000})
    advance(proc)
    for name in ("1000", "1001", "1004", "1005"):
        shutil.rmtree(proc / name)
    load = sampler.sample({"a": 1000})
    # Keyed by pid alone this would be 150 - 2000, clamped to nothing; counted twice it would be more.
    assert load.shards[0].cpu_cores == pytest.approx(150 / 100 / 10)


def test_a_group_with_no_processes_left_reports_zero(proc):
    _, load = two_samples(proc, {"gone": 4242})
    assert load.shards[0].cpu_cores == 0
    assert load.shards[0].rss_bytes == 0


def test_malformed_lines_are_skipped_with_a_warning(proc, caplog):
    with caplog.at_level(logging.WARNING, logger="agent.procfs"):
        _, load = two_samples(proc, {"a": 1000})
    warnings = " ".join(r.getMessage() for r in caplog.records)
    assert "3001/stat" in warnings and "3002/stat" in warnings
    assert "Bogus" in warnings
    assert load.memory_available_bytes == 12288000 * 1024


def test_a_garbled_proc_stat_gives_no_load_rather_than_a_wrong_one(proc, caplog):
    sampler = Sampler(proc, clock_ticks=100, page_size=PAGE)
    sampler.sample({})
    advance(proc)
    (proc / "stat").write_text("cpu  a b c d\n")
    with caplog.at_level(logging.WARNING):
        assert sampler.sample({}) is None
    assert "malformed" in caplog.text


def test_a_process_that_vanishes_between_sightings_is_skipped(proc, monkeypatch):
    real_open = procfs.os.open

    def open_or_vanish(path, flags):
        if path.endswith("/1001/stat"):
            raise ProcessLookupError
        return real_open(path, flags)

    monkeypatch.setattr(procfs.os, "open", open_or_vanish)
    found = Descendants(proc).scan({1000})
    assert sorted(m.stat.pid for m in found) == [1000, 1002, 1003, 1005]


def test_counters_that_go_backwards_do_not_give_negative_load(proc):
    sampler = Sampler(proc, clock_ticks=100, page_size=PAGE)
    advance(proc)
    sampler.sample({"a": 1000})
    # Now read the earlier tree again: every counter moves backwards, uptime too.
    shutil.rmtree(proc)
    shutil.copytree(FIXTURES / "proc", proc)
    (proc / "uptime").write_text("1020.00 0\n")
    load = sampler.sample({"a": 1000})
    assert load.cpu_percent == 0
    assert load.shards[0].cpu_cores >= 0


def test_parse_pid_stat_counts_fields_from_the_last_parenthesis():
    stat = procfs.parse_pid_stat((FIXTURES / "proc" / "1001" / "stat").read_bytes())
    assert (stat.pid, stat.ppid, stat.pgrp, stat.ticks, stat.start, stat.rss_pages) == (
        1001,
        1,
        1000,
        100,
        50010,
        12800,
    )
