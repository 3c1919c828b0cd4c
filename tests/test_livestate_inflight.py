"""The gateways' in-flight reports: summed over gateways, a silent gateway's ignored, an unreadable one's too."""

from __future__ import annotations

import time

from livestate import inflight, keys


def test_counts_are_summed_over_the_gateways_that_reported_recently(redis_client):
    now = time.time()
    inflight.report("gw-a", {"chat-r1": 2, "chat-r2": 0}, now=now)
    inflight.report("gw-b", {"chat-r1": 1, "code-r4": 7}, now=now - 1)
    inflight.report("gw-silent", {"chat-r1": 50}, now=now - inflight.REPORT_MAX_AGE - 0.1)
    redis_client.hset(keys.GATEWAY_IN_FLIGHT, "gw-garbled", b"\xff not json")
    redis_client.hset(keys.GATEWAY_IN_FLIGHT, "gw-shapeless", b'{"at": "soon", "replicas": []}')
    assert inflight.read(now) == {"chat-r1": 3, "code-r4": 7}


def test_a_report_replaces_the_same_gateways_last(redis_client):
    inflight.report("gw-a", {"chat-r1": 2})
    inflight.report("gw-a", {})
    assert inflight.read() == {}


def test_no_gateway_no_counts(redis_client):
    assert inflight.read() == {}
