"""Token budgets: which tenants have spent their tokens for this minute or this day (UTC).

Read by the sync each pass (gateway.wanted) into the gateway's budget map, so a tenant over its
budget is refused (429) within about a second of its usage being recorded, on every gateway.
A day starts at midnight UTC and a minute at its 00 second: the clock's time zone, or a local
clock change at midnight, does not move them. The tenant pages (nodes/views/tenants.py) show
the same figures and the same verdict, from `used` and `verdict`.
"""

from __future__ import annotations

from datetime import datetime

from django.db.models import F, Sum
from django.utils import timezone

from gateway.models import Tenant, TokenMinute, Usage

MINUTE = 60
DAY = 86_400


def spent(now: datetime | None = None) -> dict[str, str]:
    """Tenant → `window:limit:seconds in the window` for each active tenant whose budget is spent."""
    now = now or timezone.now()
    tenants = Tenant.objects.filter(active=True).exclude(tokens_per_minute__isnull=True, tokens_per_day__isnull=True)
    budgets = list(tenants.values_list("name", "tokens_per_minute", "tokens_per_day"))
    if not budgets:
        return {}
    tokens = used([name for name, _, _ in budgets], now)
    over = {}
    for name, per_minute, per_day in budgets:
        today, this_minute = tokens.get(name, (0, 0))
        if found := verdict(per_minute, per_day, today, this_minute):
            over[name] = found
    return over


def used(names: list[str], now: datetime) -> dict[str, tuple[int, int]]:
    """Tenant → (tokens since midnight UTC, tokens this UTC minute), for those of `names` that used any; two queries."""
    minute = now.replace(second=0, microsecond=0)
    midnight = now.replace(hour=0, minute=0, second=0, microsecond=0)
    this_minute = dict(TokenMinute.objects.filter(tenant__in=names, minute=minute).values_list("tenant", "tokens"))
    today = dict(
        Usage.objects.filter(tenant__in=names, hour__gte=midnight)
        .values("tenant")
        .annotate(tokens=Sum(F("prompt_tokens") + F("completion_tokens")))
        .values_list("tenant", "tokens")
    )
    return {name: (today.get(name, 0), this_minute.get(name, 0)) for name in set(today) | set(this_minute)}


def verdict(per_minute: int | None, per_day: int | None, today: int, this_minute: int) -> str | None:
    """`window:limit:seconds in the window` when a budget is spent (a limit of 0 is spent at once), else None."""
    # The day's budget first: it holds longer, so its Retry-After is the truer one.
    if per_day is not None and today >= per_day:
        return f"day:{per_day}:{DAY}"
    if per_minute is not None and this_minute >= per_minute:
        return f"minute:{per_minute}:{MINUTE}"
    return None
