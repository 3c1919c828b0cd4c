"""The tenant pages: `/tenants/`, every tenant with its budgets' use; `/tenants/<name>/`, one tenant.

A tenant's page shows its state and keys (prefixes only: the secrets are never stored), its
four limits, its tokens today (since midnight UTC) and this minute against its budgets, whether
it is over budget now (the verdict the gateway's sync reaches, gateway.budgets), and its usage
over the last 24 h from the hourly `Usage` rows, by model and replica and by hour. All of it
refreshes every 5 s (`tenant-live`); the charts, from Prometheus (`llmgw_gateway_*` by tenant),
load after the page and refresh every 30 s from their own URL, as the model page's do.
A fixed number of queries whatever the tenant's keys, models or hours.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from functools import wraps

from django.core.exceptions import PermissionDenied
from django.db.models import Count, Q, Sum
from django.http import Http404
from django.shortcuts import render
from django.utils import timezone
from django.views.decorators.http import require_GET
from django_htmx.http import HttpResponseStopPolling

from gateway import budgets
from gateway.models import ApiKey, Tenant, Usage
from inventory.models import Deployment
from nodes import promgateway, promquery
from nodes.templatetags.llmgw import bar_class
from nodes.views.access import login_required
from nodes.views.node import charts_section, chosen_range

# The usage tables cover this much: the hourly rows from the hour that began 24 h ago to now.
WINDOW = timedelta(hours=24)
# Tenants a page of the list shows; a row costs about as much as one of the cluster table's.
PAGE_SIZE = 100


@dataclass(frozen=True)
class Budget:
    """One token budget against what was used in its window."""

    used: int
    limit: int | None

    @property
    def percent(self) -> float | None:
        """Used of the limit in percent (may pass 100); None without a budget. A limit of 0 is spent at once."""
        if self.limit is None:
            return None
        return 100.0 * self.used / self.limit if self.limit else 100.0

    @property
    def fill(self) -> str:
        return bar_class(self.percent)

    @property
    def spent(self) -> bool:
        return self.limit is not None and self.used >= self.limit

    @property
    def meter_now(self) -> int:
        """aria-valuenow, kept within the meter's range; the text says the true figure."""
        return min(self.used, self.limit or 0)


@dataclass(frozen=True)
class Over:
    """Why the gateway refuses the tenant's requests now, from gateway.budgets.verdict."""

    window: str  # "day" or "minute"
    limit: int

    @classmethod
    def parse(cls, found: str | None) -> Over | None:
        if found is None:
            return None
        window, limit, _ = found.split(":")
        return cls(window, int(limit))


@dataclass(frozen=True)
class KeyRow:
    prefix: str
    name: str
    created_at: datetime
    expires_at: datetime | None
    revoked_at: datetime | None
    revoked_by: str
    state: str  # usable, revoked, expired, tenant inactive

    @classmethod
    def of(cls, key: ApiKey, tenant: Tenant, now: datetime) -> KeyRow:
        if key.revoked_at is not None:
            state = "revoked"
        elif key.expires_at is not None and key.expires_at <= now:
            state = "expired"
        elif not tenant.active:
            state = "tenant inactive"
        else:
            state = "usable"
        return cls(key.prefix, key.name, key.created_at, key.expires_at, key.revoked_at, key.revoked_by, state)


def floor_hour(moment: datetime) -> datetime:
    return moment.replace(minute=0, second=0, microsecond=0)


def standing(tenant: Tenant, today: int, this_minute: int) -> dict:
    """The tenant's two budgets against their use, and whether the gateway refuses it for one now."""
    found = budgets.verdict(tenant.tokens_per_minute, tenant.tokens_per_day, today, this_minute)
    return {
        "day": Budget(today, tenant.tokens_per_day),
        "minute": Budget(this_minute, tenant.tokens_per_minute),
        # gateway.budgets.spent() holds only active tenants to budgets: an inactive one is refused anyway.
        "over": Over.parse(found) if tenant.active else None,
    }


_SUMS = {"requests": Sum("requests"), "prompt": Sum("prompt_tokens"), "completion": Sum("completion_tokens")}


def usage_since(name: str, since: datetime, now: datetime) -> dict:
    """The tenant's usage from `since` by model and replica, by hour (every hour, none left out), and in all."""
    rows = Usage.objects.filter(tenant=name, hour__gte=since)
    by_replica = list(rows.values("model", "replica").annotate(**_SUMS).order_by("model", "replica"))
    per_hour = {row["hour"]: row for row in rows.values("hour").annotate(**_SUMS).order_by()}
    hours = []
    hour = floor_hour(now)
    while hour >= since:
        found = per_hour.get(hour, {})
        prompt, completion = found.get("prompt", 0), found.get("completion", 0)
        hours.append(
            {"hour": hour, "requests": found.get("requests", 0), "prompt": prompt, "completion": completion}
            | {"tokens": prompt + completion}
        )
        hour -= timedelta(hours=1)
    busiest = max((h["tokens"] for h in hours), default=0)
    for h in hours:
        h["fill"] = bar_class(100.0 * h["tokens"] / busiest if busiest else 0)
    for row in by_replica:
        row["tokens"] = row["prompt"] + row["completion"]
    total = {key: sum(row[key] for row in by_replica) for key in ("requests", "prompt", "completion", "tokens")}
    return {"since": since, "by_replica": by_replica, "hours": hours, "total": total}


def _tenant(name: str) -> Tenant | None:
    return Tenant.objects.filter(name=name).first()


def may_view_tenants(view):
    """Tenants' usage, limits and keys are the admin's to see (its "view tenant" permission): a user without
    it gets 403 here too, so a page never shows more than the user's permissions would in the admin."""

    @wraps(view)
    def wrapper(request, *args, **kwargs):
        if not request.user.has_perm("gateway.view_tenant"):
            raise PermissionDenied("viewing tenants needs the gateway's view tenant permission")
        return view(request, *args, **kwargs)

    return wrapper


@require_GET
@login_required
@may_view_tenants
def tenants(request):
    """Every tenant, 100 a page: state, keys usable of all, limits, tokens today and this minute against the budgets."""
    now = timezone.now()
    count = Tenant.objects.count()
    pages = max(1, -(-count // PAGE_SIZE))
    # Anything malformed is the first page, and a page past the end the last, as on the cluster page.
    asked = request.GET.get("page", "")
    page = min(max(int(asked[:9]), 1), pages) if asked.isascii() and asked.isdigit() else 1
    usable = Q(keys__revoked_at__isnull=True) & (Q(keys__expires_at__isnull=True) | Q(keys__expires_at__gt=now))
    found = list(
        Tenant.objects.annotate(keys_total=Count("keys"), keys_usable=Count("keys", filter=usable)).order_by("name")[
            (page - 1) * PAGE_SIZE : page * PAGE_SIZE
        ]
    )
    tokens = budgets.used([tenant.name for tenant in found], now)
    rows = [{"tenant": tenant, **standing(tenant, *tokens.get(tenant.name, (0, 0)))} for tenant in found]
    context = {"rows": rows, "count": count, "page": page, "pages": pages}
    template = "nodes/tenants.html#live" if request.htmx else "nodes/tenants.html"
    return render(request, template, context)


@require_GET
@login_required
@may_view_tenants
def tenant(request, name: str):
    found = _tenant(name)
    if found is None:
        if request.htmx:
            # The tenant was deleted or renamed while its page was open: stop polling for it.
            return HttpResponseStopPolling()
        raise Http404("no such tenant")
    now = timezone.now()
    today, this_minute = budgets.used([found.name], now).get(found.name, (0, 0))
    usage = usage_since(found.name, floor_hour(now - WINDOW), now)
    models = {row["model"] for row in usage["by_replica"]}
    context = {
        "tenant": found,
        "keys": [KeyRow.of(key, found, now) for key in found.keys.order_by("-created_at")],
        "usage": usage,
        # Usage outlives deployments: only a model still served links to its page.
        "served_models": set(
            Deployment.objects.filter(served_model_name__in=models).values_list("served_model_name", flat=True)
        )
        if models
        else set(),
        "minute_window": f"since {now:%H:%M} UTC",
        **standing(found, today, this_minute),
    }
    if request.htmx:
        return render(request, "nodes/tenant.html#live", context)
    context["time_range"], context["range_problem"] = chosen_range(request.GET)
    context["ranges"] = list(promquery.RANGES.values())
    return render(request, "nodes/tenant.html", context)


@require_GET
@login_required
@may_view_tenants
def tenant_charts(request, name: str):
    found = _tenant(name)
    if found is None:
        if request.htmx:
            return HttpResponseStopPolling()
        raise Http404("no such tenant")
    charts = promgateway.tenant_charts(found.name, found.tokens_per_minute)
    return charts_section(request, "nodes/tenant.html#charts", {"tenant": found}, charts)
