"""Recovery from the control plane's own outage, at small scale: a fleet beats, the control plane stops, comes back.

The clock is frozen and moved by hand (time_machine); the web tier is the
Django test client, and "stopped" means no heartbeat reaches it. Sweeps run
as beat runs them: the Celery task, called every LLMGW_BEAT_PERIOD.
Thresholds are shortened (a heartbeat every 4 s, a sweep every 2 s,
unreachable after 12 s) so that the timeline keeps the proportions of the
defaults (5 s, 5 s, 30 s) in fewer steps.
"""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta

import pytest
import time_machine
from django.db import connection
from django.test.utils import CaptureQueriesContext

import livestate
from agent import protocol
from devstack.faults import redis_unreachable
from inventory import heartbeat as heartbeat_action
from inventory import liveness, sweep
from inventory.models import Liveness, Node, NodeEvent
from inventory.tasks import mark_stale as mark_stale_task
from livestate import cards, keys, locks, selfmetrics
from nodes.api import proxyclock
from tests.agentapi import JOIN_TOKEN, heartbeat, post, register, reply_of

pytestmark = [pytest.mark.django_db]

START = datetime(2026, 6, 1, 12, 0, tzinfo=UTC)
INTERVAL = 4.0
PERIOD = 2.0
UNREACHABLE_AFTER = 12.0


@pytest.fixture(autouse=True)
def _settings(settings, redis_client):
    settings.LLMGW_JOIN_TOKEN = JOIN_TOKEN
    settings.LLMGW_HEARTBEAT_INTERVAL = INTERVAL
    settings.LLMGW_BEAT_PERIOD = PERIOD
    settings.LLMGW_UNREACHABLE_AFTER = UNREACHABLE_AFTER
    settings.LLMGW_LOST_AFTER = 300
    settings.LLMGW_DISRUPTION_THRESHOLD = 0.55
    # Redis was emptied: this process's note of accepted heartbeats must be sent again.
    heartbeat_action._pulse.reset()
    sweep.warn_grace.reset()
    sweep.warn_skipped.reset()
    proxyclock.forget()


@pytest.fixture
def clock():
    with time_machine.travel(START, tick=False) as traveller:
        yield traveller


def at(seconds: float) -> datetime:
    return START + timedelta(seconds=seconds)


class Fleet:
    """Nodes that beat every INTERVAL, half of them PERIOD after the other half, as agents' own timers spread them."""

    def __init__(self, client, clock, size: int):
        self.client, self.clock = client, clock
        self.tokens = {f"n{i:03d}": register(client, f"n{i:03d}") for i in range(size)}
        self.silent: set[str] = set()
        self.summaries: list[tuple[float, dict]] = []

    def names_beating_at(self, seconds: float) -> list[str]:
        phase = round(seconds / PERIOD) % round(INTERVAL / PERIOD)
        return [name for i, name in enumerate(sorted(self.tokens)) if i % 2 == phase and name not in self.silent]

    def step(
        self,
        seconds: float,
        *,
        web: bool = True,
        sweeps: bool = True,
        waited: float | None = None,
        proxy_behind: float | None = None,
    ) -> None:
        """One beat period: the nodes due beat (if the web tier is up), then beat runs the sweep (if it runs).

        With `waited`, each heartbeat comes as through the proxy, having waited that long there for a worker.
        With `proxy_behind`, the proxy's clock is that many seconds behind the web tier's (negative: ahead),
        and the proxy's health check reaches the web tier first, without waiting.
        """
        self.clock.move_to(at(seconds))
        if web:
            headers = {}
            skew = proxy_behind or 0.0
            if proxy_behind is not None:
                stamp = f"t={round((at(seconds).timestamp() - skew) * 1e6)}"
                checked = self.client.get("/healthz", headers={"X-Request-Start": stamp, "X-LLMGW-Proxy": "lb-1"})
                assert checked.status_code == 200
                headers["X-LLMGW-Proxy"] = "lb-1"
            if waited is not None:
                headers["X-Request-Start"] = f"t={round((at(seconds).timestamp() - waited - skew) * 1e6)}"
            for name in self.names_beating_at(seconds):
                answer = post(self.client, "/api/v1/heartbeat", protocol.Heartbeat(), self.tokens[name], **headers)
                reply = reply_of(answer)
                assert reply.state == "ready", f"{name} was told {reply.state} at {seconds} s"
        if sweeps:
            self.summaries.append((seconds, mark_stale_task()))

    def run(self, start: float, end: float, **kwargs) -> None:
        """Every beat period from `start` to `end` s, both included."""
        for step in range(round(start / PERIOD), round(end / PERIOD) + 1):
            self.step(step * PERIOD, **kwargs)

    def marked_unreachable(self) -> dict[str, list[float]]:
        """Node → the times (s after START) it was marked unreachable."""
        events = NodeEvent.objects.filter(kind=NodeEvent.Kind.LIVENESS, to_state=Liveness.UNREACHABLE)
        marked: dict[str, list[float]] = {}
        for node_id, when in events.values_list("node_id", "at"):
            marked.setdefault(node_id, []).append((when - START).total_seconds())
        return marked


def liveness_counts() -> dict[str, int]:
    counts: dict[str, int] = {}
    for state in Node.objects.values_list("liveness", flat=True):
        counts[state] = counts.get(state, 0) + 1
    return counts


def test_after_the_web_tier_stops_for_longer_than_the_threshold_no_node_is_marked_and_a_dead_one_is_after_grace(
    client, clock
):
    fleet = Fleet(client, clock, 200)
    dead = "n007"
    fleet.run(0, 2)  # every node beats once; the first sweep's grace (no earlier sweep) lasts until 12 s

    # The web tier stops for 32 s, well past the threshold; the sweep goes on.
    fleet.silent.add(dead)  # one node really dies at the same moment
    fleet.run(4, 34, web=False)
    assert fleet.marked_unreachable() == {}, "no heartbeat anywhere is the control plane's silence"
    assert any("no heartbeat accepted anywhere" in str(summary["grace"]) for _, summary in fleet.summaries)

    # It comes back: within one heartbeat interval every live node has beaten and been revived by a flush.
    fleet.run(36, 38)
    assert liveness_counts() == {Liveness.ALIVE: 200}
    fleet.run(40, 46)
    assert fleet.marked_unreachable() == {}, "no node marked during the grace period"

    # The grace began with the first sweep that saw heartbeats again (36 s) and lasts the threshold.
    fleet.run(48, 56)
    assert fleet.marked_unreachable() == {dead: [48.0]}, "a really silent node is still marked, after the grace"
    assert liveness_counts() == {Liveness.ALIVE: 199, Liveness.UNREACHABLE: 1}
    assert NodeEvent.objects.filter(kind=NodeEvent.Kind.LIVENESS).count() == 1, "no node flapped"


def test_after_the_whole_control_plane_stops_the_fleet_gets_a_grace_period_and_none_flaps(client, clock):
    fleet = Fleet(client, clock, 200)
    fleet.run(0, 2)

    # Web tier and Celery both stopped for 48 s: no heartbeat accepted, no sweep.
    fleet.run(4, 50, web=False, sweeps=False)
    # Back at 52 s: half the fleet beats at 52, the other half at 54. Without a grace
    # period the sweep at 52 would mark the second half, silent for 52 s by the database.
    fleet.run(52, 52)
    assert "no sweep ran for 50 s" in fleet.summaries[-1][1]["grace"]
    fleet.run(54, 66)

    assert fleet.marked_unreachable() == {}
    assert liveness_counts() == {Liveness.ALIVE: 200}


def test_reviving_200_unreachable_nodes_writes_nothing_per_heartbeat_and_a_few_rows_per_batch(
    client, clock, settings, monkeypatch
):
    # Turned off, the disruption rules let the outage mark the whole fleet unreachable, as it did before them.
    settings.LLMGW_DISRUPTION_THRESHOLD = 1.0
    monkeypatch.setattr(liveness, "FLUSH_BATCH", 50)
    fleet = Fleet(client, clock, 200)
    fleet.run(0, 14, web=False)  # silent since registering
    assert liveness_counts() == {Liveness.UNREACHABLE: 200}

    clock.move_to(at(16))
    with CaptureQueriesContext(connection) as beats:
        for name in sorted(fleet.tokens):
            assert reply_of(heartbeat(client, fleet.tokens[name], protocol.Heartbeat())).state == "ready"
    assert writes(beats) == [], "a heartbeat of an unreachable node writes no row"

    with CaptureQueriesContext(connection) as swept:
        summary = mark_stale_task()
    batches = math.ceil(200 / 50)
    # Per batch: the heartbeat times, the revival (compare-and-set), the revival events.
    assert len(writes(swept)) <= 3 * batches
    assert summary["revived"] == 200
    assert liveness_counts() == {Liveness.ALIVE: 200}
    revivals = NodeEvent.objects.filter(kind=NodeEvent.Kind.LIVENESS, to_state=Liveness.ALIVE)
    assert set(revivals.values_list("from_state", flat=True)) == {Liveness.UNREACHABLE}
    assert revivals.count() == 200
    # The revival left the cards current: the next heartbeat is told the same without a query.
    with CaptureQueriesContext(connection) as after:
        assert reply_of(heartbeat(client, fleet.tokens["n000"], protocol.Heartbeat())).state == "ready"
    assert after.captured_queries == []


def writes(captured: CaptureQueriesContext) -> list[str]:
    return [query["sql"] for query in captured.captured_queries if query["sql"].split()[0] in ("UPDATE", "INSERT")]


def test_marking_200_nodes_unreachable_is_a_few_statements_per_batch(client, clock, settings, monkeypatch):
    settings.LLMGW_DISRUPTION_THRESHOLD = 1.0
    monkeypatch.setattr(liveness, "FLUSH_BATCH", 50)
    Fleet(client, clock, 200)  # registered at START, silent since
    clock.move_to(at(13))

    with CaptureQueriesContext(connection) as swept:
        result = liveness.mark_stale()

    assert len(result.unreachable) == 200
    assert len(writes(swept)) <= 2 * math.ceil(200 / 50)


def test_of_two_sweeps_started_at_once_one_runs_and_the_other_skips_and_counts_it(
    client, clock, redis_client, monkeypatch
):
    register(client, "solo")
    started_meanwhile = []
    real = sweep.mark_stale

    def mark_stale_while_another_starts(*args, **kwargs):
        # Another worker's sweep starts while this one holds the lock.
        started_meanwhile.append(mark_stale_task())
        return real(*args, **kwargs)

    monkeypatch.setattr(sweep, "mark_stale", mark_stale_while_another_starts)
    summary = mark_stale_task()

    assert "flushed" in summary
    assert started_meanwhile == [{"skipped": "another sweep is running"}]
    counters = selfmetrics.read(redis_client.hgetall(keys.SELF_METRICS))
    assert (counters["sweeps"], counters["sweeps:skipped"]) == (1, 1)
    assert not redis_client.exists(keys.SWEEP_LOCK), "released on exit"
    assert "flushed" in mark_stale_task(), "the next sweep runs"


def test_a_sweep_that_raises_releases_its_lock(client, clock, redis_client, monkeypatch):
    def fails(*args, **kwargs):
        raise RuntimeError("database gone")

    monkeypatch.setattr(sweep, "mark_stale", fails)
    with pytest.raises(RuntimeError):
        mark_stale_task()
    assert not redis_client.exists(keys.SWEEP_LOCK)


def test_a_lock_left_by_a_dead_worker_expires(clock, redis_client):
    locks.sweep_lock(sweep.SWEEP_LOCK_SECONDS).acquire()
    assert 0 < redis_client.ttl(keys.SWEEP_LOCK) <= sweep.SWEEP_LOCK_SECONDS


def test_while_redis_is_down_the_sweep_skips_and_afterwards_gives_the_fleet_its_grace(client, clock, settings):
    fleet = Fleet(client, clock, 4)
    fleet.silent.add("n000")
    fleet.run(0, 12)
    redis_url = settings.REDIS_URL
    with redis_unreachable(settings):
        for seconds in (14, 16, 18, 20):
            clock.move_to(at(seconds))
            assert mark_stale_task() == {"skipped": "Redis unavailable"}
        assert liveness_counts() == {Liveness.ALIVE: 4}
    settings.REDIS_URL = redis_url
    livestate.reset_client()

    fleet.run(22, 32)
    assert "no sweep ran for 10 s" in fleet.summaries[-6][1]["grace"]
    assert fleet.marked_unreachable() == {}, "graced until 34 s"
    fleet.run(34, 34)
    assert fleet.marked_unreachable() == {"n000": [34.0]}


def test_while_heartbeats_queue_in_the_proxy_no_node_is_marked_and_a_dead_one_is_once_they_no_longer_do(
    client, clock, settings
):
    settings.LLMGW_PROXY_HOPS = 1
    settings.LLMGW_BEHIND_AFTER = 1.0
    fleet = Fleet(client, clock, 20)
    dead = "n007"
    fleet.run(0, 12, waited=0.01)  # the first sweep's grace (no earlier sweep) lasts until 12 s
    # The node dies while the control plane falls behind: every heartbeat waits 3 s for a worker.
    fleet.silent.add(dead)
    fleet.run(14, 40, waited=3.0)
    assert fleet.marked_unreachable() == {}, "silence while heartbeats queue is the control plane's"
    assert any("behind on its heartbeats: one waited 3.0 s" in str(summary["grace"]) for _, summary in fleet.summaries)
    # Caught up at 42 s: the last backlog noted (at 40 s) is seen by the sweeps for the outage gap (8 s),
    # each extending the grace by LLMGW_UNREACHABLE_AFTER (12 s): until 48 + 12 = 60 s.
    fleet.run(42, 58, waited=0.01)
    assert fleet.marked_unreachable() == {}, "no node marked during the grace period after the backlog"
    fleet.run(60, 62, waited=0.01)
    assert fleet.marked_unreachable() == {dead: [60.0]}, "a really silent node is still marked, after the grace"
    assert NodeEvent.objects.filter(kind=NodeEvent.Kind.LIVENESS).count() == 1, "no node flapped"


def test_a_proxy_whose_clock_is_behind_does_not_hold_the_sweep_back_once_its_health_checks_show_it(
    client, clock, settings
):
    # Without its checks, every heartbeat through this proxy would look 3 s queued, and the sweep
    # would hold back for as long as the clock was wrong: the dead node never marked.
    settings.LLMGW_PROXY_HOPS = 1
    settings.LLMGW_BEHIND_AFTER = 1.0
    fleet = Fleet(client, clock, 20)
    dead = "n007"
    fleet.run(0, 12, waited=0.01, proxy_behind=3.0)
    fleet.silent.add(dead)  # its last heartbeat was at 10 s
    fleet.run(14, 26, waited=0.01, proxy_behind=3.0)
    assert fleet.marked_unreachable() == {dead: [24.0]}, "marked once silent for LLMGW_UNREACHABLE_AFTER, as ever"
    assert not any("behind" in str(summary["grace"]) for _, summary in fleet.summaries)
    offsets = selfmetrics.proxy_clocks(selfmetrics.read(livestate.client().hgetall(keys.SELF_METRICS)), 0)
    assert offsets == {("lb-1", proxyclock._HOST): pytest.approx(3.0)}


def test_a_proxy_whose_clock_is_ahead_does_not_hide_a_backlog_once_its_health_checks_show_it(client, clock, settings):
    settings.LLMGW_PROXY_HOPS = 1
    settings.LLMGW_BEHIND_AFTER = 1.0
    fleet = Fleet(client, clock, 20)
    fleet.run(0, 12, waited=0.01, proxy_behind=-3.0)
    fleet.silent.add("n007")
    # Heartbeats wait 3 s for a worker, but stamped by a clock 3 s ahead they read as not waiting at all.
    fleet.run(14, 26, waited=3.0, proxy_behind=-3.0)
    assert fleet.marked_unreachable() == {}, "silence while heartbeats queue is the control plane's"
    assert any("behind on its heartbeats: one waited 3.0 s" in str(summary["grace"]) for _, summary in fleet.summaries)


@pytest.mark.parametrize(
    ("hops", "waited", "threshold"),
    [
        pytest.param(1, 0.5, 0.55, id="heartbeats-waiting-less-than-LLMGW_BEHIND_AFTER"),
        pytest.param(0, 3.0, 0.55, id="a-wait-written-by-a-client-with-no-proxy-in-front"),
        pytest.param(1, 3.0, 1.0, id="the-disruption-rules-turned-off"),
    ],
)
def test_a_dead_node_is_marked_on_time_unless_heartbeats_waited_in_our_proxy(
    client, clock, settings, hops, waited, threshold
):
    settings.LLMGW_PROXY_HOPS = hops
    settings.LLMGW_DISRUPTION_THRESHOLD = threshold
    settings.LLMGW_BEHIND_AFTER = 1.0
    fleet = Fleet(client, clock, 20)
    dead = "n007"
    fleet.run(0, 12, waited=waited)
    fleet.silent.add(dead)  # its last heartbeat was at 10 s
    fleet.run(14, 26, waited=waited)
    assert fleet.marked_unreachable() == {dead: [24.0]}, "marked once silent for LLMGW_UNREACHABLE_AFTER, as ever"
    assert not any("behind" in str(summary["grace"]) for _, summary in fleet.summaries)


def test_the_only_node_of_a_cluster_falling_silent_is_its_own_silence(client, clock):
    fleet = Fleet(client, clock, 1)
    fleet.run(0, 12)
    fleet.silent.add("n000")
    fleet.run(14, 26)
    # Its last heartbeat was at 12 s: unreachable 12 s later, whatever the fleet's silence.
    assert fleet.marked_unreachable() == {"n000": [26.0]}


def test_a_fleet_falling_silent_is_believed_when_the_disruption_rules_are_off(client, clock, settings):
    settings.LLMGW_DISRUPTION_THRESHOLD = 1.0
    fleet = Fleet(client, clock, 4)
    fleet.run(0, 12)
    fleet.run(14, 26, web=False)
    assert sorted(fleet.marked_unreachable()) == ["n000", "n001", "n002", "n003"]


def cached_card(redis_client, node_id: str) -> cards.NodeCard | None:
    """The node's card in Redis if it is current (its generation is the node's), else None."""
    raw = redis_client.get(keys.card(node_id))
    generation = int(redis_client.get(keys.generation(node_id)) or 0)
    card = cards.decode(raw) if raw else None
    return card if card is not None and card.generation == generation else None


def test_a_fleet_back_from_a_partition_keeps_its_cards_and_the_flush_revives_it(client, clock, redis_client, settings):
    settings.LLMGW_DISRUPTION_THRESHOLD = 1.0
    fleet = Fleet(client, clock, 2)
    fleet.run(0, 4)
    card = cached_card(redis_client, "n000")
    assert card is not None and card.liveness == Liveness.ALIVE

    fleet.run(6, 18, web=False)
    assert liveness_counts() == {Liveness.UNREACHABLE: 2}
    assert cached_card(redis_client, "n000") == card, "marking the fleet unreachable left its cards current"

    # n000 beats: its card and shard list are current, so it stays on the path that asks the database nothing.
    with CaptureQueriesContext(connection) as beat:
        fleet.step(20, sweeps=False)  # asserts that it is told "ready"
    assert beat.captured_queries == []
    assert Node.objects.get(pk="n000").liveness == Liveness.UNREACHABLE

    fleet.step(22)  # the flush revives it in the database, and leaves its card alone
    assert Node.objects.get(pk="n000").liveness == Liveness.ALIVE
    assert cached_card(redis_client, "n000") == card
