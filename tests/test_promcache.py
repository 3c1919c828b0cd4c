"""Prometheus' answers for the pages are asked again behind the page: no render waits for a slow Prometheus."""

from __future__ import annotations

import threading

from devstack.polling import wait_until
from nodes.promcache import THREAD_NAME, AnswerCache


def asking_threads() -> list[threading.Thread]:
    return [thread for thread in threading.enumerate() if thread.name == THREAD_NAME]


def test_an_old_answer_is_shown_while_one_thread_asks_again():
    # Every answer is old at once (max_age 0), none too old to show.
    cache: AnswerCache[str] = AnswerCache(max_age=0, stale_limit=60)
    assert cache.get("alerts", lambda: "first") == "first"
    release = threading.Event()
    asked: list[int] = []

    def slow() -> str:
        asked.append(1)
        release.wait(10)
        return "second"

    # Prometheus has not answered yet: the renders are not held, and ask once.
    for _ in range(5):
        assert cache.get("alerts", slow) == "first"
    wait_until(lambda: bool(asked), 10, "the asking thread")
    assert len(asked) == 1
    release.set()
    wait_until(lambda: not asking_threads(), 10, "the answer")
    assert cache.get("alerts", lambda: "third") == "second"
    wait_until(lambda: not asking_threads(), 10, "the next answer")


def test_an_answer_too_old_to_show_is_waited_for():
    cache: AnswerCache[str] = AnswerCache(max_age=0, stale_limit=0)
    assert cache.get("waiting", lambda: "first") == "first"
    assert cache.get("waiting", lambda: "second") == "second"
    assert not asking_threads()


def test_a_failed_ask_is_logged_and_asked_again(caplog):
    cache: AnswerCache[str] = AnswerCache(max_age=0, stale_limit=60)
    assert cache.get("alerts", lambda: "first") == "first"

    def broken() -> str:
        raise RuntimeError("a bug in the fetch")

    assert cache.get("alerts", broken) == "first"
    wait_until(lambda: not asking_threads(), 10, "the failed ask")
    assert "asking Prometheus again" in caplog.text
    # Still the old answer, and a new ask is started rather than none ever again.
    assert cache.get("alerts", lambda: "second") == "first"
    wait_until(lambda: not asking_threads(), 10, "the next ask")
    assert cache.get("alerts", lambda: "third") in ("second", "third")
    wait_until(lambda: not asking_threads(), 10, "the last ask")
