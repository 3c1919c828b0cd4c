"""The cyclic collector paused around allocation-heavy work, and the loaded application left out of collections."""

from __future__ import annotations

import gc
import threading

import pytest

from lib import collector


@pytest.fixture
def collector_on():
    gc.enable()
    yield
    gc.enable()


def test_a_pause_turns_the_collector_off_and_back_on(collector_on):
    with collector.paused():
        assert not gc.isenabled()
    assert gc.isenabled()


def test_overlapping_pauses_in_two_threads_restore_it_only_when_the_last_ends(collector_on):
    first_in, second_in, first_out = threading.Event(), threading.Event(), threading.Event()
    during_second: list[bool] = []

    def first() -> None:
        with collector.paused():
            first_in.set()
            second_in.wait(5)
        first_out.set()

    def second() -> None:
        first_in.wait(5)
        with collector.paused():
            second_in.set()
            first_out.wait(5)
            during_second.append(gc.isenabled())

    threads = [threading.Thread(target=first), threading.Thread(target=second)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(5)
    assert during_second == [False]
    assert gc.isenabled()


def test_a_pause_leaves_a_collector_that_was_off_off(collector_on):
    gc.disable()
    with collector.paused():
        pass
    assert not gc.isenabled()


def test_a_pause_restores_the_collector_when_the_work_fails(collector_on):
    with pytest.raises(ValueError), collector.paused():
        raise ValueError("boom")
    assert gc.isenabled()


def test_what_was_loaded_is_left_out_of_later_collections():
    loaded = [[] for _ in range(1000)]
    try:
        collector.freeze_loaded()
        assert gc.get_freeze_count() >= len(loaded)
        collected = {id(found) for generation in range(3) for found in gc.get_objects(generation=generation)}
        assert not any(id(item) in collected for item in loaded)
    finally:
        gc.unfreeze()
