"""Property: only operators change admin state; liveness follows heartbeats and silence."""

from datetime import timedelta

import pytest
from django.conf import settings
from django.utils import timezone
from hypothesis import HealthCheck, given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st

from inventory.liveness import mark_stale, touch
from inventory.models import AdminState, Liveness, Node, NodeEvent, NodeState
from inventory.operator import ACTIONS, set_admin_state
from inventory.registration import upsert_inventory
from tests.factories import make_inventory

pytestmark = pytest.mark.django_db

seconds = st.floats(min_value=0, max_value=600, allow_nan=False)
steps = st.lists(
    st.one_of(
        st.tuples(st.just("upsert"), st.integers(min_value=0, max_value=4)),
        st.tuples(st.just("beat"), seconds),
        st.tuples(st.just("sweep"), seconds),
        st.tuples(st.just("operator"), st.sampled_from(sorted(ACTIONS))),
    ),
    max_size=25,
)


@hypothesis_settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(steps=steps)
def test_only_operator_actions_change_admin_state(operator, steps):
    Node.objects.all().delete()
    now = timezone.now()
    node, _ = upsert_inventory("prop", make_inventory("prop.example"), now=now)
    expected_admin, expected_liveness, last_beat = AdminState.ACTIVE, Liveness.ALIVE, now
    unreachable_after = timedelta(seconds=settings.LLMGW_UNREACHABLE_AFTER)
    lost_after = timedelta(seconds=settings.LLMGW_LOST_AFTER)

    for kind, arg in steps:
        if kind == "upsert":
            upsert_inventory("prop", make_inventory("prop.example", gpus=arg), now=now)
        elif kind == "beat":
            now += timedelta(seconds=arg)
            touch(Node.objects.get(pk="prop"), now)
            expected_liveness, last_beat = Liveness.ALIVE, now
        elif kind == "sweep":
            now += timedelta(seconds=arg)
            mark_stale(now)
            silence = now - last_beat
            if expected_liveness == Liveness.ALIVE and silence > unreachable_after:
                expected_liveness = Liveness.UNREACHABLE
            if expected_liveness == Liveness.UNREACHABLE and silence > lost_after:
                expected_liveness = Liveness.LOST
        else:
            set_admin_state(Node.objects.get(pk="prop"), ACTIONS[arg], operator, "property test")
            expected_admin = ACTIONS[arg]
        node = Node.objects.get(pk="prop")
        assert node.admin_state == expected_admin, (kind, arg)
        assert node.liveness == expected_liveness, (kind, arg)

    admin_events = NodeEvent.objects.filter(node_id="prop", kind=NodeEvent.Kind.ADMIN)
    assert all(event.actor == operator.username for event in admin_events)


def test_a_cordoned_node_that_goes_unreachable_and_returns_is_still_cordoned(operator):
    now = timezone.now()
    node, _ = upsert_inventory("n1", make_inventory("n1.example"), now=now)
    set_admin_state(node, AdminState.CORDONED, operator, "bad DIMM")

    later = now + timedelta(seconds=settings.LLMGW_UNREACHABLE_AFTER + 1)
    assert mark_stale(later).unreachable == ["n1"]
    node.refresh_from_db()
    assert node.state == NodeState.UNREACHABLE

    touch(node, later + timedelta(seconds=1))
    node.refresh_from_db()
    assert node.state == NodeState.CORDONED
    assert not node.schedulable


def test_a_sweep_run_twice_changes_nothing_twice():
    now = timezone.now()
    upsert_inventory("n1", make_inventory("n1.example"), now=now)
    later = now + timedelta(seconds=settings.LLMGW_UNREACHABLE_AFTER + 1)
    assert mark_stale(later).unreachable == ["n1"]
    assert mark_stale(later).unreachable == []
    assert NodeEvent.objects.filter(node_id="n1", kind=NodeEvent.Kind.LIVENESS).count() == 1


def test_lost_node_releases_its_replicas_whole():
    from inventory.models import Allocation
    from tests.factories import place

    now = timezone.now()
    upsert_inventory("lost", make_inventory("lost.example", gpus=2), now=now)
    upsert_inventory("other", make_inventory("other.example", gpus=2), now=now)
    place("a", {"lost": [0], "other": [0]})
    place("b", {"other": [1]})
    Node.objects.filter(pk="other").update(last_heartbeat=now + timedelta(seconds=10_000))

    mark_stale(now + timedelta(seconds=settings.LLMGW_UNREACHABLE_AFTER + 1))
    result = mark_stale(now + timedelta(seconds=settings.LLMGW_LOST_AFTER + 1))
    assert result.lost == ["lost"]
    assert result.released_replicas == ["a-r1"]
    assert list(Allocation.objects.values_list("shard_id", flat=True)) == ["b-r1-s0"]
