"""Node events are bounded (issue 22): repeats fold into one event, and beat prunes what is older than the retention.

Each change of an install entry recorded an event and nothing removed any: ten
flapping inventories of 32 installs wrote 320 events. Inventories are stored
through `inventory.registration` here, as a heartbeat carrying one stores them.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
import time_machine
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from agent import protocol
from inventory import events
from inventory.models import NodeEvent
from inventory.registration import upsert_inventory
from inventory.tasks import prune_events
from nodes.views.node import events_in
from tests.factories import make_inventory

pytestmark = pytest.mark.django_db

ENGINES = [f"engine-{i}" for i in range(protocol.MAX_ENGINES)]


def store(state: protocol.InstallState, engines: list[str] = ENGINES) -> int:
    """One inventory with every engine's install in `state`; the number of queries it took."""
    inventory = make_inventory(
        "flappy.example",
        provision=[protocol.EngineInstall(engine=e, variant="cuda", state=state, detail="x\ny") for e in engines],
    )
    with CaptureQueriesContext(connection) as queries:
        upsert_inventory("flappy", inventory)
    return len(queries)


def installs() -> list[tuple[str, str, str, int]]:
    rows = NodeEvent.objects.filter(kind=NodeEvent.Kind.INSTALL).order_by("at", "id")
    return list(rows.values_list("subject", "from_state", "to_state", "repeats"))


def test_a_flapping_inventory_folds_into_one_event_per_change_and_its_cost_stays_flat():
    costs = [store("installing" if flap % 2 == 0 else "failed") for flap in range(10)]

    # Each engine: first seen installing, then failed, then installing again, then the same two changes.
    assert len(installs()) == 3 * len(ENGINES)
    assert installs()[:2] == [("engine-0 cuda", "", "installing", 1), ("engine-1 cuda", "", "installing", 1)]
    repeats = {(s, old, new): n for s, old, new, n in installs()}
    assert repeats["engine-0 cuda", "installing", "failed"] == 5
    assert repeats["engine-0 cuda", "failed", "installing"] == 4
    # Every inventory after the first two of each change does the same work, however many flaps came before.
    assert len(set(costs[4:])) == 1, costs
    for _ in range(10):
        store("installing")
        store("failed")
    assert len(installs()) == 3 * len(ENGINES)
    assert store("installing") == costs[4]


def test_a_change_after_the_window_is_a_new_event(settings):
    settings.LLMGW_EVENT_COALESCE_SECONDS = 60
    engine = ["vllm"]
    with time_machine.travel(timezone.now(), tick=False) as clock:
        store("installing", engine)
        store("failed", engine)
        clock.shift(30)
        store("installing", engine)
        store("failed", engine)
        # 61 s after the failure's last repeat: a new event, not a repeat.
        clock.shift(61)
        store("installing", engine)
        store("failed", engine)
    assert installs() == [
        ("vllm cuda", "", "installing", 1),
        ("vllm cuda", "installing", "failed", 2),
        ("vllm cuda", "failed", "installing", 1),
        ("vllm cuda", "failed", "installing", 1),
        ("vllm cuda", "installing", "failed", 1),
    ]
    folded = NodeEvent.objects.get(to_state="failed", repeats=2)
    assert folded.last_at - folded.at == timedelta(seconds=30)


def test_a_window_of_zero_folds_nothing(settings):
    settings.LLMGW_EVENT_COALESCE_SECONDS = 0
    for _ in range(3):
        store("installing", ["vllm"])
        store("failed", ["vllm"])
    assert len(installs()) == 6


def test_a_folded_event_says_how_often_under_the_node_charts():
    for _ in range(3):
        store("installing", ["vllm"])
        store("failed", ["vllm"])
    now = timezone.now().timestamp()
    texts = [event["text"] for event in events_in("flappy", now - 60, now + 60)]
    assert any("3 times, last at" in text for text in texts), texts


def test_beat_prunes_events_past_the_retention_and_keeps_the_rest(settings, monkeypatch):
    settings.LLMGW_EVENT_RETENTION_DAYS = 7
    monkeypatch.setattr(events, "PRUNE_BATCH", 2)
    start = timezone.now() - timedelta(days=10)
    with time_machine.travel(start, tick=False) as clock:
        store("installing", ["old-1", "old-2", "old-3", "repeated"])
        clock.shift(timedelta(days=5))
        store("installing", ["recent"])
    # "repeated" first happened 10 days ago and again just now: kept for its latest.
    old = NodeEvent.objects.get(subject="repeated cuda")
    NodeEvent.objects.filter(pk=old.pk).update(repeats=2, last_at=timezone.now())

    assert prune_events() == {"deleted": 3}
    assert sorted(NodeEvent.objects.values_list("subject", flat=True)) == ["recent cuda", "repeated cuda"]
    assert prune_events() == {"deleted": 0}


def test_the_pruning_task_is_on_beat(settings):
    entry = settings.CELERY_BEAT_SCHEDULE["prune-events"]
    assert entry["task"] == prune_events.name
