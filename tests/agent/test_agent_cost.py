"""What a sample costs on a big host: it follows the engines' processes, not the host's.

A fixture /proc holds 10,000 unrelated processes and two engines. Every file the
sampler opens or lists is counted; before this was fixed, each steady sample listed
all 10,000 entries and kept a note on each of them.
"""

import os
import tracemalloc

import pytest

from agent.load import Sampler
from tests.agent import bigproc

HOST_PROCESSES = 10_000


class Counter:
    """Counts the /proc entries the code under test opens or lists, by wrapping the os functions it calls."""

    def __init__(self, monkeypatch, root):
        self.root = os.fspath(root)
        self.opened: list[str] = []
        self.listed = 0
        real_open, real_scandir, real_listdir = os.open, os.scandir, os.listdir

        def counting_open(path, flags, *args, **kwargs):
            if os.fspath(path).startswith(self.root):
                self.opened.append(os.fspath(path))
            return real_open(path, flags, *args, **kwargs)

        def counting_scandir(path="."):
            entries = list(real_scandir(path))
            if os.fspath(path).startswith(self.root):
                self.listed += len(entries)
            return _Entries(entries)

        def counting_listdir(path="."):
            names = real_listdir(path)
            if os.fspath(path).startswith(self.root):
                self.listed += len(names)
            return names

        monkeypatch.setattr(os, "open", counting_open)
        monkeypatch.setattr(os, "scandir", counting_scandir)
        monkeypatch.setattr(os, "listdir", counting_listdir)

    def reset(self):
        self.opened, self.listed = [], 0

    def pids_opened(self) -> set[int]:
        return {int(part) for path in self.opened for part in path[len(self.root) :].split("/")[1:2] if part.isdigit()}


class _Entries(list):
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


@pytest.fixture
def host(tmp_path):
    # Two engines of 1 + 20 + 5 processes after 10,000 unrelated ones, and 30 more unrelated after them.
    return bigproc.build(tmp_path / "proc", HOST_PROCESSES, cpus=64, engines=[(20, 5), (20, 5)], after=30)


def test_a_steady_sample_reads_the_engines_processes_not_the_hosts(host, monkeypatch):
    groups = {f"e{i}": engine.leader for i, engine in enumerate(host.engines)}
    sampler = Sampler(host.root, clock_ticks=bigproc.CLOCK_TICKS, page_size=bigproc.PAGE)
    counter = Counter(monkeypatch, host.root)
    sampler.sample(groups)
    first = len(counter.opened) + counter.listed
    host.advance(5.0, ticks_per_process=10, new_host_processes=12)
    counter.reset()

    load = sampler.sample(groups)

    engine_processes = sum(len(engine.pids) for engine in host.engines)
    touched = len(counter.opened) + counter.listed
    assert counter.listed == 0, "a steady sample must not list /proc"
    # Each engine process once (stat), plus each pid handed out since the previous sample.
    assert touched <= engine_processes + 12, f"{touched} entries read for {engine_processes} engine processes"
    assert first < 2 * (engine_processes + 30 + 2), f"the first sample read {first} entries"
    assert [s.cpu_cores for s in load.shards] == [pytest.approx(26 * 10 / bigproc.CLOCK_TICKS / 5.0)] * 2


def test_the_sampler_keeps_nothing_per_host_process(host):
    groups = {f"e{i}": engine.leader for i, engine in enumerate(host.engines)}
    sampler = Sampler(host.root, clock_ticks=bigproc.CLOCK_TICKS, page_size=bigproc.PAGE)
    tracemalloc.start()
    try:
        before = tracemalloc.take_snapshot()
        sampler.sample(groups)
        host.advance(5.0, ticks_per_process=10)
        sampler.sample(groups)
        kept = sum(stat.size_diff for stat in tracemalloc.take_snapshot().compare_to(before, "filename"))
    finally:
        tracemalloc.stop()
    # A note on each of 10,000 processes would be ~1 MB; the engines' 52 processes are a few KB.
    assert kept < 100_000, f"{kept} bytes kept after two samples"
