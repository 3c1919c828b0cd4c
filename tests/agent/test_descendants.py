"""The walker finds an engine's processes and nothing else, reading only the pids it must."""

import logging
import os
import shutil

import pytest

from agent import procfs
from agent.descendants import Descendants
from tests.agent import bigproc


@pytest.fixture
def opened(monkeypatch):
    """The pids whose /proc entries were opened, in order."""
    pids: list[int] = []
    real_open = procfs.os.open

    def counting_open(path, flags):
        parts = os.fspath(path).rsplit("/", 2)
        if parts[-2].isdigit():
            pids.append(int(parts[-2]))
        return real_open(path, flags)

    monkeypatch.setattr(procfs.os, "open", counting_open)
    return pids


def test_only_the_engines_descendants_are_found_and_no_older_pid_is_opened(tmp_path, opened):
    host = bigproc.build(tmp_path / "proc", 1_000, cpus=8, engines=[(10, 3)], after=20)
    engine = host.engines[0]
    walker = Descendants(host.root)

    found = walker.scan({engine.leader})

    # The leader, its workers and their children, one of which left the session; not the worker's thread.
    assert sorted(m.stat.pid for m in found) == sorted(engine.pids)
    assert {m.leader for m in found} == {engine.leader}
    assert engine.thread not in {m.stat.pid for m in found}
    assert min(opened) == engine.leader, "a pid handed out before the engine's leader was opened"
    assert len(set(opened)) == len(engine.pids) + 1 + 20, "each of the engine's pids and the 20 after them"


def test_a_steady_scan_rereads_the_engine_and_only_the_new_pids(tmp_path, opened):
    host = bigproc.build(tmp_path / "proc", 1_000, cpus=8, engines=[(10, 3)], after=20)
    engine = host.engines[0]
    walker = Descendants(host.root)
    walker.scan({engine.leader})
    newcomers = host.host(5)
    child = host.fork(engine, parent=engine.pids[2])
    host.finish()
    opened.clear()

    found = walker.scan({engine.leader})

    assert child in {m.stat.pid for m in found}
    # stat of every engine process, stat of each new pid, status of the new member.
    assert sorted(opened) == sorted([*engine.pids, *newcomers, child])


def test_children_born_after_the_pids_wrapped_are_found(tmp_path):
    host = bigproc.BigProc(tmp_path / "proc", cpus=4, pid_max=5_000, last_pid=4_990)
    host.root.mkdir()
    engine = host.engine(3)
    host.finish()
    walker = Descendants(host.root)
    walker.scan({engine.leader})
    host.host(10)  # crosses pid_max: these and what follows start again at 300
    child = host.fork(engine, parent=engine.leader)
    host.finish()

    found = walker.scan({engine.leader})

    assert child < engine.leader
    assert child in {m.stat.pid for m in found}


def test_when_every_pid_may_have_been_reused_the_listing_is_read(tmp_path, caplog):
    host = bigproc.BigProc(tmp_path / "proc", cpus=4, pid_max=5_000)
    host.root.mkdir()
    engine = host.engine(3)
    host.host(100)
    host.finish()
    walker = Descendants(host.root)
    walker.scan({engine.leader}, forks=host.forks)
    # A child on a pid below the last one, after more forks than there are pids: the kernel went all the way round.
    host.forks += host.pid_max
    child = host.fork(engine, parent=engine.leader, pid=engine.leader + 50)
    host.finish()
    with caplog.at_level(logging.INFO, logger="agent.descendants"):
        found = walker.scan({engine.leader}, forks=host.forks)

    assert child in {m.stat.pid for m in found}
    assert "examining every process" in caplog.text


def test_without_the_last_pid_the_listing_is_read(tmp_path):
    host = bigproc.build(tmp_path / "proc", 50, cpus=4, engines=[(3, 0)])
    (host.root / "loadavg").write_text("1.00 1.00 1.00\n")
    engine = host.engines[0]

    found = Descendants(host.root).scan({engine.leader})

    assert sorted(m.stat.pid for m in found) == sorted(engine.pids)


def test_an_engine_started_between_scans_is_found_with_its_children(tmp_path):
    host = bigproc.build(tmp_path / "proc", 100, cpus=4, engines=[(2, 0)])
    walker = Descendants(host.root)
    walker.scan({host.engines[0].leader})
    second = host.engine(4)
    host.finish()

    found = walker.scan({e.leader for e in host.engines})

    by_leader = {}
    for member in found:
        by_leader.setdefault(member.leader, set()).add(member.stat.pid)
    assert by_leader == {e.leader: set(e.pids) for e in host.engines}
    assert second.leader in by_leader


def test_an_exited_process_is_forgotten_and_a_reused_pid_is_examined_again(tmp_path):
    host = bigproc.build(tmp_path / "proc", 100, cpus=4, engines=[(3, 0)])
    engine = host.engines[0]
    walker = Descendants(host.root)
    walker.scan({engine.leader})
    gone = engine.pids.pop()
    shutil.rmtree(host.root / str(gone))
    host.finish()

    found = walker.scan({engine.leader})

    assert gone not in {m.stat.pid for m in found}
    assert gone not in walker.members, "an exited process must not be remembered"


def test_a_stopped_engines_processes_are_forgotten(tmp_path):
    host = bigproc.build(tmp_path / "proc", 100, cpus=4, engines=[(3, 0), (2, 0)])
    walker = Descendants(host.root)
    walker.scan({e.leader for e in host.engines})

    found = walker.scan({host.engines[1].leader})

    assert {m.leader for m in found} == {host.engines[1].leader}
    assert set(walker.members) == set(host.engines[1].pids)
