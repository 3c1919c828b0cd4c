"""Which tenants have spent their token budget: by the UTC minute and the UTC day, from recorded usage."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
import time_machine
from django.utils import timezone

from gateway import budgets, usage
from gateway.models import Tenant, TokenMinute, Usage
from gateway.usage import Counted

pytestmark = pytest.mark.django_db

BEFORE_MIDNIGHT = datetime(2026, 12, 2, 23, 59, 30, tzinfo=UTC)
AFTER_MIDNIGHT = datetime(2026, 12, 3, 0, 0, 5, tzinfo=UTC)


def spend(tenant: str, tokens: int, at: datetime) -> None:
    usage.record({(tenant, "chat", "r1"): Counted(1, tokens // 2, tokens - tokens // 2)}, now=at)


def test_a_day_spent_before_midnight_utc_is_available_again_after_it():
    Tenant.objects.create(name="acme", tokens_per_day=100)
    spend("acme", 100, BEFORE_MIDNIGHT)
    assert budgets.spent(BEFORE_MIDNIGHT) == {"acme": "day:100:86400"}
    assert budgets.spent(AFTER_MIDNIGHT) == {}


def test_the_minute_budget_counts_only_this_minute_and_old_minutes_are_deleted():
    Tenant.objects.create(name="acme", tokens_per_minute=50)
    spend("acme", 30, datetime(2026, 12, 2, 10, 0, 10, tzinfo=UTC))
    spend("acme", 30, datetime(2026, 12, 2, 10, 0, 50, tzinfo=UTC))
    assert budgets.spent(datetime(2026, 12, 2, 10, 0, 55, tzinfo=UTC)) == {"acme": "minute:50:60"}
    assert budgets.spent(datetime(2026, 12, 2, 10, 1, 0, tzinfo=UTC)) == {}
    spend("acme", 1, datetime(2026, 12, 2, 10, 5, 0, tzinfo=UTC))
    assert list(TokenMinute.objects.values_list("tokens", flat=True)) == [1]


def test_the_clock_crossing_midnight_utc_ends_the_day(monkeypatch):
    Tenant.objects.create(name="acme", tokens_per_day=10)
    # The machine's own time zone is not the day's: a local midnight elsewhere changes nothing.
    monkeypatch.setenv("TZ", "Pacific/Kiritimati")
    with time_machine.travel(BEFORE_MIDNIGHT, tick=False) as clock:
        spend("acme", 10, timezone.now())
        assert budgets.spent() == {"acme": "day:10:86400"}
        clock.move_to(AFTER_MIDNIGHT)
        assert budgets.spent() == {}


def test_an_inactive_tenant_or_one_without_budgets_is_never_listed():
    Tenant.objects.create(name="idle", tokens_per_day=0, active=False)
    Tenant.objects.create(name="free")
    spend("free", 10**9, BEFORE_MIDNIGHT)
    assert budgets.spent(BEFORE_MIDNIGHT) == {}


def test_two_syncs_adding_to_one_hour_add_up():
    at = datetime(2026, 12, 2, 10, 0, 0, tzinfo=UTC)
    spend("acme", 10, at)
    spend("acme", 6, at.replace(minute=30))
    (row,) = Usage.objects.all()
    assert (row.requests, row.prompt_tokens + row.completion_tokens) == (2, 16)
