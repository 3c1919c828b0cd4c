"""A control plane that fails, hangs and recovers: the agent samples on, backs off, sends only the newest load."""

import ctypes
import gc
import random
import threading

import msgspec
import psutil
import pytest

from agent.loop import Agent, Tuning
from devstack.polling import wait_until
from tests.agent.conftest import FAST

MiB = 2**20
LIBC = ctypes.CDLL("libc.so.6")


def settled_rss() -> int:
    """This process's RSS once garbage is collected and malloc has handed its free pages back.

    The test runs inside the whole suite's process, where freed but unreturned
    arenas of earlier tests' threads would otherwise read as the agent's growth.
    """
    gc.collect()
    LIBC.malloc_trim(0)
    return psutil.Process().memory_info().rss


def tag_samples(agent: Agent) -> list[int]:
    """Number each load the agent produces (in load1), so the test can tell which one was sent."""
    produced: list[int] = []
    real = agent.sampler.sample
    lock = threading.Lock()

    def numbered(groups, placements=None):
        load = real(groups, placements)
        if load is None:
            return None
        with lock:
            produced.append(len(produced) + 1)
            return msgspec.structs.replace(load, load1=float(produced[-1]))

    agent.sampler.sample = numbered  # type: ignore[method-assign]
    return produced


def test_fail_hang_recover(plane, make_agent):
    agent = make_agent(plane, tuning=Tuning(**{**FAST.__dict__, "backoff_cap": 0.002}))
    produced = tag_samples(agent)
    agent.start()
    wait_until(lambda: plane.accepted() >= 1, 10, "a first heartbeat")

    # Failing: 1,000 failed beats, with memory measured after a warm-up.
    plane.mode = "fail"
    wait_until(lambda: agent.beats_failed >= 200, 60, "200 failed beats")
    rss_before = settled_rss()
    objects_before = len(gc.get_objects())
    samples_before = agent.samples
    wait_until(lambda: agent.beats_failed >= 1200, 120, "1,000 more failed beats")
    rss_growth = settled_rss() - rss_before
    object_growth = len(gc.get_objects()) - objects_before
    assert rss_growth < 2 * MiB, f"RSS grew by {rss_growth / MiB:.1f} MiB over 1,000 failed beats"
    assert object_growth < 500, f"{object_growth} more live objects after 1,000 failed beats"
    assert agent.samples > samples_before, "sampling stopped while heartbeats failed"

    # Hanging: each attempt waits for the read timeout, and sampling goes on meanwhile.
    plane.released.clear()
    plane.mode = "hang"
    attempts, samples = plane.attempts, agent.samples
    wait_until(lambda: plane.attempts >= attempts + 3, 10, "three hung attempts")
    assert agent.samples >= samples + 6, "sampling waited for the hung control plane"

    # Recovering: the next accepted heartbeat carries a load newer than any from before.
    newest_before = produced[-1]
    accepted = plane.accepted()
    plane.mode = "ok"
    plane.released.set()
    wait_until(lambda: plane.accepted() >= accepted + 3, 10, "heartbeats accepted again")
    sent = [int(b.load.load1) for b in list(plane.heartbeats)[accepted:]]
    assert sent[0] >= newest_before, f"an old load ({sent[0]}) was sent after the outage (newest {newest_before})"
    assert sent == sorted(sent), "loads went out of order: something was queued"
    wait_until(lambda: agent.beats_failed == 0, 5, "the failure count to reset")


def test_backoff_is_full_jitter_under_an_exponential_ceiling(tmp_path, plane, make_agent):
    agent = make_agent(plane, tuning=Tuning(backoff_base=1.0, backoff_cap=30.0))
    random.seed(7)
    for failures, ceiling in ((1, 1), (2, 2), (3, 4), (5, 16), (6, 30), (50, 30)):
        agent.beats_failed = failures
        delays = [agent._backoff() for _ in range(2000)]
        assert 0 <= min(delays) < ceiling * 0.05
        assert ceiling * 0.95 < max(delays) <= ceiling
        assert sum(delays) / len(delays) == pytest.approx(ceiling / 2, rel=0.1)
