"""The stale-marking sweep, called as a function with the clock moved across each threshold."""

import logging
from datetime import UTC, datetime, timedelta

import pytest
import time_machine
from django.db import connection

from agent import protocol
from devstack.faults import redis_unreachable
from inventory import liveness
from inventory.models import AdminState, Allocation, Liveness, Node, NodeEvent
from inventory.tasks import mark_stale as mark_stale_task
from livestate import keys, selfmetrics
from tests.agentapi import JOIN_TOKEN, heartbeat, register, reply_of
from tests.factories import place

pytestmark = [pytest.mark.django_db]

START = datetime(2026, 6, 1, 12, 0, tzinfo=UTC)


@pytest.fixture(autouse=True)
def _settings(settings, redis_client):
    settings.LLMGW_JOIN_TOKEN = JOIN_TOKEN
    settings.LLMGW_UNREACHABLE_AFTER = 30
    settings.LLMGW_LOST_AFTER = 300
    settings.LLMGW_DISRUPTION_THRESHOLD = 0.55
    liveness.warn_holding_back.reset()


@pytest.fixture
def clock():
    with time_machine.travel(START, tick=False) as traveller:
        yield traveller


@pytest.fixture
def tokens(client, clock):
    """Two nodes that registered at START, one of them cordoned."""
    tokens = {name: register(client, name, gpus=2) for name in ("gpu-1", "gpu-2")}
    Node.objects.filter(pk="gpu-2").update(admin_state=AdminState.CORDONED)
    return tokens


@pytest.fixture
def whole_cluster_may_be_lost(settings):
    """For tests of one node's thresholds that silence both nodes of `tokens`.

    Both silent at once is a disruption of the whole cluster, in which the sweep
    would mark neither lost (the tests of that rule are below).
    """
    settings.LLMGW_DISRUPTION_THRESHOLD = 1.0


def liveness_of(node_id: str) -> str:
    return Node.objects.get(pk=node_id).liveness


def at(seconds: float) -> datetime:
    return START + timedelta(seconds=seconds)


def test_a_silent_node_becomes_unreachable_after_30_s_then_lost_after_300_s(clock, tokens, whole_cluster_may_be_lost):
    clock.move_to(at(29.9))
    assert liveness.mark_stale().unreachable == []

    clock.move_to(at(30.1))
    result = liveness.mark_stale()
    assert sorted(result.unreachable) == ["gpu-1", "gpu-2"]
    assert liveness_of("gpu-1") == Liveness.UNREACHABLE
    event = NodeEvent.objects.filter(node_id="gpu-1", kind=NodeEvent.Kind.LIVENESS).first()
    assert (event.from_state, event.to_state, event.at) == (Liveness.ALIVE, Liveness.UNREACHABLE, at(30.1))
    assert "30" in event.reason

    clock.move_to(at(299.9))
    assert liveness.mark_stale().lost == []

    clock.move_to(at(300.1))
    result = liveness.mark_stale()
    assert sorted(result.lost) == ["gpu-1", "gpu-2"]
    assert liveness_of("gpu-1") == Liveness.LOST
    # Liveness never touches the operator's decision.
    assert Node.objects.get(pk="gpu-2").admin_state == AdminState.CORDONED


def test_a_late_or_repeated_sweep_changes_nothing_twice(clock, tokens, whole_cluster_may_be_lost):
    clock.move_to(at(31))
    assert liveness.mark_stale().unreachable
    assert liveness.mark_stale().unreachable == []
    clock.move_to(at(400))
    assert liveness.mark_stale().lost
    assert liveness.mark_stale().lost == []
    kinds = NodeEvent.objects.filter(node_id="gpu-1", kind=NodeEvent.Kind.LIVENESS).values_list("to_state", flat=True)
    assert sorted(kinds) == [Liveness.LOST, Liveness.UNREACHABLE]


def test_a_heartbeat_still_held_in_redis_counts(client, clock, tokens):
    clock.move_to(at(20))
    reply_of(heartbeat(client, tokens["gpu-1"], protocol.Heartbeat()))
    assert Node.objects.get(pk="gpu-1").last_heartbeat == START  # not flushed yet

    clock.move_to(at(31))
    result = liveness.mark_stale()

    assert result.flushed == 1
    assert result.unreachable == ["gpu-2"]
    assert Node.objects.get(pk="gpu-1").last_heartbeat == at(20)


def test_a_lost_node_frees_every_replica_with_a_shard_on_it_whole(client, clock, tokens):
    place("a", {"gpu-1": [0], "gpu-2": [0]})  # one replica, its second shard on a node that stays
    place("b", {"gpu-2": [1]})
    clock.move_to(at(31))
    liveness.mark_stale()
    clock.move_to(at(280))  # recent enough that gpu-2 is alive at the next sweep
    reply_of(heartbeat(client, tokens["gpu-2"], protocol.Heartbeat()))

    clock.move_to(at(301))
    result = liveness.mark_stale()

    assert result.lost == ["gpu-1"]
    assert result.released_replicas == ["a-r1"]
    assert list(Allocation.objects.values_list("shard_id", flat=True)) == ["b-r1-s0"]


def test_a_failure_on_one_node_does_not_stop_the_rest(clock, tokens, monkeypatch):
    real = liveness.change_liveness

    def batch_fails(*args, **kwargs):
        raise RuntimeError("boom")

    def fails_for_gpu_1(node_id, *args, **kwargs):
        if node_id == "gpu-1":
            raise RuntimeError("boom")
        return real(node_id, *args, **kwargs)

    # The batch fails, so its nodes are tried one by one, and one of them fails again.
    monkeypatch.setattr(liveness, "_change_batch", batch_fails)
    monkeypatch.setattr(liveness, "change_liveness", fails_for_gpu_1)
    clock.move_to(at(31))
    result = liveness.mark_stale()

    assert result.failed == ["gpu-1"]
    assert result.unreachable == ["gpu-2"]
    assert liveness_of("gpu-1") == Liveness.ALIVE


def test_the_rules_themselves_need_no_redis(clock, tokens, settings):
    # The Celery task does not sweep while Redis is down (tests/test_recovery.py); the rules could.
    with redis_unreachable(settings):
        clock.move_to(at(31))
        result = liveness.mark_stale()
    assert sorted(result.unreachable) == ["gpu-1", "gpu-2"]


def run_task_every_beat_period(clock, until: float) -> list[dict]:
    """Run the Celery task as beat would, every LLMGW_BEAT_PERIOD from START up to `until` s; returns its summaries."""
    summaries, step = [], 0
    while step * 5.0 <= until:
        clock.move_to(at(step * 5.0))
        summaries.append(mark_stale_task())
        step += 1
    return summaries


def test_the_celery_task_flushes_sweeps_and_counts_its_runs(clock, tokens, redis_client, whole_cluster_may_be_lost):
    summaries = run_task_every_beat_period(clock, 35)

    assert sorted(node for summary in summaries for node in summary["unreachable"]) == ["gpu-1", "gpu-2"]
    assert [summary["failed"] for summary in summaries] == [[]] * 8
    assert selfmetrics.read(redis_client.hgetall(keys.SELF_METRICS))["sweeps"] == 8


def test_a_heartbeat_after_the_sweep_revives_the_node_with_the_next_flush(
    client, clock, tokens, whole_cluster_may_be_lost
):
    reply_of(heartbeat(client, tokens["gpu-2"], protocol.Heartbeat()))  # caches the card as alive
    clock.move_to(at(301))
    liveness.mark_stale()
    liveness.mark_stale()
    assert liveness_of("gpu-2") == Liveness.LOST

    reply = reply_of(heartbeat(client, tokens["gpu-2"], protocol.Heartbeat()))

    assert reply.state == "cordoned", "answered as alive at once, its cordon kept"
    assert liveness_of("gpu-2") == Liveness.LOST, "no database write per heartbeat"
    clock.move_to(at(303))
    assert liveness.mark_stale().revived == ["gpu-2"]
    assert liveness_of("gpu-2") == Liveness.ALIVE
    assert Node.objects.get(pk="gpu-2").last_heartbeat == at(301)
    event = NodeEvent.objects.filter(node_id="gpu-2", kind=NodeEvent.Kind.LIVENESS).first()
    assert (event.from_state, event.to_state, event.at) == (Liveness.LOST, Liveness.ALIVE, at(303))


def test_the_flush_writes_every_held_time_across_batches(redis_client):
    count = liveness.FLUSH_BATCH * 2 + 7
    Node.objects.bulk_create(Node(id=f"n{i:04d}", last_heartbeat=START) for i in range(count))
    arrived = {f"n{i:04d}": START.timestamp() + i for i in range(count)}
    redis_client.hset(keys.HEARTBEATS, mapping={k: repr(v) for k, v in arrived.items()})

    assert liveness.flush().times == count

    stored = dict(Node.objects.values_list("id", "last_heartbeat"))
    assert all(stored[node_id].timestamp() == at for node_id, at in arrived.items())
    assert not redis_client.exists(keys.HEARTBEATS)


def test_the_flush_never_moves_a_heartbeat_time_back(redis_client):
    # `touch` writes a time straight to the row while Redis is down; an older
    # one held in Redis from before must not replace it.
    later = START + timedelta(seconds=10)
    Node.objects.bulk_create([Node(id="touched", last_heartbeat=later), Node(id="older", last_heartbeat=START)])
    held = repr((START + timedelta(seconds=5)).timestamp())
    redis_client.hset(keys.HEARTBEATS, mapping={"touched": held, "older": held})

    liveness.flush()

    stored = dict(Node.objects.values_list("id", "last_heartbeat"))
    assert stored == {"touched": later, "older": START + timedelta(seconds=5)}


@pytest.mark.skipif(connection.vendor != "postgresql", reason="HOT updates are PostgreSQL's")
def test_the_flush_rewrites_no_index_on_postgresql(redis_client):
    # Every sweep rewrites the whole fleet's rows: an index on the time would
    # make each of those writes grow it, and keep the old rows until a VACUUM.
    Node.objects.bulk_create(Node(id=f"n{i:03d}", last_heartbeat=START) for i in range(100))
    redis_client.hset(keys.HEARTBEATS, mapping={f"n{i:03d}": repr(START.timestamp() + 1) for i in range(100)})

    before = _updates_so_far()
    liveness.flush()
    after = _updates_so_far()

    assert (after[0] - before[0], after[1] - before[1]) == (100, 100)


def _updates_so_far() -> tuple[int, int]:
    """The node table's updates and HOT updates, counted by this backend: no wait for the statistics."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pg_stat_get_xact_tuples_updated(%s::regclass), pg_stat_get_xact_tuples_hot_updated(%s::regclass)",
            [Node._meta.db_table] * 2,
        )
        return cursor.fetchone()


# -- most of the fleet silent at once -------------------------------------------------------------


@pytest.fixture
def fleet(client, clock) -> dict[str, str]:
    """Ten nodes, with a GPU each, that registered at START: name → token."""
    return {f"n{i:02d}": register(client, f"n{i:02d}", gpus=1) for i in range(10)}


def beat(client, fleet: dict[str, str], names: list[str]) -> None:
    for name in names:
        reply_of(heartbeat(client, fleet[name], protocol.Heartbeat()))


def test_when_most_of_the_fleet_falls_silent_at_once_none_is_lost(client, clock, fleet, caplog):
    names = sorted(fleet)
    silent, live = names[:6], names[6:]
    place("a", {silent[0]: [0]})
    clock.move_to(at(280))
    beat(client, fleet, live)

    clock.move_to(at(301))
    with caplog.at_level(logging.WARNING, logger="inventory.liveness"):
        result = liveness.mark_stale()
        clock.move_to(at(306))
        beat(client, fleet, live)
        again = liveness.mark_stale()

    assert sorted(result.unreachable) == silent, "unreachable marking goes on"
    assert (result.lost, result.held, result.released_replicas) == ([], 6, [])
    assert {liveness_of(name) for name in silent} == {Liveness.UNREACHABLE}
    assert Allocation.objects.filter(replica_id="a-r1").exists()
    assert (again.lost, again.held) == ([], 6)
    warnings = [r.getMessage() for r in caplog.records if r.name == "inventory.liveness"]
    assert len(warnings) == 1, "at most once a minute"
    assert "6 of 10 nodes are unreachable" in warnings[0]


@pytest.mark.parametrize(
    ("silent_count", "threshold", "held"),
    [
        (2, 0.55, False),
        (5, 0.55, False),
        (6, 0.55, True),
        (5, 0.5, False),  # more than the threshold holds back, not as much
        (6, 0.5, True),
        (10, 1.0, False),  # 1 turns the rule off
    ],
)
def test_the_sweep_holds_back_only_when_more_than_the_threshold_is_unreachable(
    client, clock, fleet, settings, silent_count, threshold, held
):
    settings.LLMGW_DISRUPTION_THRESHOLD = threshold
    names = sorted(fleet)
    silent = names[:silent_count]
    clock.move_to(at(280))
    beat(client, fleet, names[silent_count:])

    clock.move_to(at(301))
    result = liveness.mark_stale()

    assert result.held == (silent_count if held else 0)
    assert sorted(result.lost) == ([] if held else silent)


def test_once_the_fleet_recovers_the_node_still_silent_is_lost_on_the_next_sweep(client, clock, fleet):
    names = sorted(fleet)
    silent, live = names[:6], names[6:]
    clock.move_to(at(280))
    beat(client, fleet, live)
    clock.move_to(at(301))
    assert liveness.mark_stale().held == 6

    clock.move_to(at(310))
    beat(client, fleet, live + silent[:5])
    result = liveness.mark_stale()

    assert (result.lost, result.held) == ([silent[5]], 0)
    assert liveness_of(silent[5]) == Liveness.LOST
    assert {liveness_of(name) for name in silent[:5]} == {Liveness.ALIVE}


def test_the_only_node_of_a_one_node_cluster_is_still_lost(client, clock):
    register(client, "solo")
    clock.move_to(at(301))

    result = liveness.mark_stale()

    assert (result.unreachable, result.lost, result.held) == (["solo"], ["solo"], 0)


def test_the_celery_task_reports_and_counts_a_sweep_that_held_back(client, clock, fleet, redis_client, settings):
    settings.LLMGW_LOST_AFTER = 60
    live = sorted(fleet)[6:]
    summaries = []
    for step in range(14):  # 0 to 65 s, a beat and a sweep every 5 s
        clock.move_to(at(step * 5.0))
        beat(client, fleet, live)
        summaries.append(mark_stale_task())

    assert (summaries[-1]["lost"], summaries[-1]["held"]) == ([], 6)
    counters = selfmetrics.read(redis_client.hgetall(keys.SELF_METRICS))
    assert counters["swept:lost"] == 0
    assert counters["swept:held"] >= 1
