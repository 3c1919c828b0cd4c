"""Each proxy's clock as its health checks show it (nodes/api/proxyclock.py), and what /metrics makes of it."""

from __future__ import annotations

import time

import pytest

from livestate import selfmetrics
from nodes.api import proxyclock
from nodes.api.proxyclock import ProxyClocks


def test_the_offset_is_the_smallest_a_check_showed_in_this_window_or_the_last():
    clocks = ProxyClocks(window=30)
    clocks.checked("lb-1", 2.004, now=1000)
    clocks.checked("lb-1", 2.001, now=1010)  # a check that waited less
    clocks.checked("lb-1", 2.9, now=1020)  # one behind a slow request
    assert clocks.offset("lb-1", now=1025) == pytest.approx(2.001)
    clocks.checked("lb-1", 0.5, now=1031)  # the proxy's clock was set: the last window still counts
    assert clocks.offset("lb-1", now=1040) == pytest.approx(0.5)
    clocks.checked("lb-1", 0.6, now=1062)  # the window before it had only the 0.5
    assert clocks.offset("lb-1", now=1062) == pytest.approx(0.5)
    clocks.checked("lb-1", 0.6, now=1093)
    assert clocks.offset("lb-1", now=1093) == pytest.approx(0.6), "a window ago's 0.5 is forgotten"


def test_each_proxy_has_its_own_offset_and_one_not_heard_from_has_none():
    clocks = ProxyClocks(window=30)
    clocks.checked("lb-1", 3.0, now=1000)
    clocks.checked("lb-2", -1.0, now=1000)
    assert clocks.offset("lb-1", now=1001) == 3.0
    assert clocks.offset("lb-2", now=1001) == -1.0
    assert clocks.offset("lb-3", now=1001) == 0.0, "never checked: waits are taken as read"
    assert clocks.offset("lb-1", now=1060) == 0.0, "no check for two windows: no estimate"
    clocks.checked("lb-1", 1.0, now=1100)
    assert clocks.offset("lb-1", now=1100) == 1.0, "nothing carried over a window with no check"


def test_a_worker_keeps_estimates_for_a_bounded_number_of_proxies():
    clocks = ProxyClocks()
    for i in range(proxyclock.MOST_PROXIES + 5):
        clocks.checked(f"lb-{i}", 1.0, now=1000)
    assert len(clocks.estimates) == proxyclock.MOST_PROXIES


@pytest.fixture
def proxied(settings):
    settings.LLMGW_PROXY_HOPS = 1
    proxyclock.forget()
    yield
    proxyclock.forget()


def stamp(at: float) -> str:
    return f"t={round(at * 1e6)}"


def test_a_wait_is_the_stamps_difference_less_the_proxys_offset(proxied, redis_client):
    now = time.time()
    meta = {"HTTP_X_REQUEST_START": stamp(now - 2.5), "HTTP_X_LLMGW_PROXY": "lb-1"}
    assert proxyclock.waited_in_proxy(meta, now) == pytest.approx(2.5), "no check yet: taken as read"
    proxyclock.health_checked({"HTTP_X_REQUEST_START": stamp(now - 2.0), "HTTP_X_LLMGW_PROXY": "lb-1"}, now)
    assert proxyclock.waited_in_proxy(meta, now) == pytest.approx(0.5)
    other = {"HTTP_X_REQUEST_START": stamp(now - 2.5), "HTTP_X_LLMGW_PROXY": "lb-2"}
    assert proxyclock.waited_in_proxy(other, now) == pytest.approx(2.5), "another proxy's clock is its own"
    # A stamp ahead of this host's clock by more than the proxy's offset is no wait at all.
    assert proxyclock.waited_in_proxy({**meta, "HTTP_X_REQUEST_START": stamp(now)}, now) == 0.0


def test_nothing_is_believed_without_a_proxy_in_front(settings, redis_client):
    settings.LLMGW_PROXY_HOPS = 0
    proxyclock.forget()
    now = time.time()
    meta = {"HTTP_X_REQUEST_START": stamp(now - 2.0), "HTTP_X_LLMGW_PROXY": "lb-1"}
    proxyclock.health_checked(meta, now)
    assert proxyclock.waited_in_proxy(meta, now) is None
    assert proxyclock._clocks.estimates == {}


@pytest.mark.parametrize("name", ["lb 1", "lb/1", 'lb"1', "x" * 64, ""])
def test_a_proxy_name_unfit_for_a_label_is_one_unnamed_proxy(proxied, redis_client, name):
    now = time.time()
    proxyclock.health_checked({"HTTP_X_REQUEST_START": stamp(now - 1.0), "HTTP_X_LLMGW_PROXY": name}, now)
    assert set(proxyclock._clocks.estimates) == {""}
    offsets = selfmetrics.proxy_clocks(selfmetrics.read(redis_client.hgetall("llmgw:selfmetrics")), 0)
    assert offsets == {("unnamed", proxyclock._HOST): pytest.approx(1.0)}


def test_a_skewed_proxy_is_logged_once_a_while(proxied, redis_client, caplog, settings):
    settings.LLMGW_BEHIND_AFTER = 1.0
    proxyclock.warn_offset.reset()
    now = time.time()
    proxyclock.health_checked({"HTTP_X_REQUEST_START": stamp(now - 0.8), "HTTP_X_LLMGW_PROXY": "lb-1"}, now)
    proxyclock.health_checked({"HTTP_X_REQUEST_START": stamp(now + 0.8), "HTTP_X_LLMGW_PROXY": "lb-2"}, now)
    warnings = [r.getMessage() for r in caplog.records if "clock of proxy" in r.getMessage()]
    assert warnings == [
        "the clock of proxy 'lb-1' is 0.80 s behind this host's (from its health checks); heartbeats' "
        'waits in it are corrected by that, but set both clocks by NTP (docs/operations.md, "When '
        'the control plane is behind")'
    ], "once in five minutes, not once a check"
    proxyclock.health_checked({"HTTP_X_REQUEST_START": stamp(now - 0.3), "HTTP_X_LLMGW_PROXY": "lb-3"}, now)
    assert len([r for r in caplog.records if "clock of proxy" in r.getMessage()]) == 1
