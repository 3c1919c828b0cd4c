"""Tokens counted at the gateway, handed over to the database: per tenant, model, replica and hour.

HAProxy's Lua filter (deploy/gateway_usage.lua) adds up each answer's `usage` as the engine
reported it; each sync pass takes those totals over the admin socket (`llmgw usage take`, which
zeroes them) and adds them to `Usage` rows. What could not be written stays with the sync
for its next pass, so a database that is down loses nothing while the sync runs.
"""

from __future__ import annotations

from datetime import timedelta

from django.db import IntegrityError, transaction
from django.db.models import F
from django.utils import timezone

from gateway.counted import Counted, Key
from gateway.models import TokenMinute, Usage


def record(counted: dict[Key, Counted], now=None) -> None:
    """Add to the hour's rows and to each tenant's minute, made when missing.

    Several gateways' syncs may add to one row at once: increments, never overwrites.
    """
    now = now or timezone.now()
    hour = now.replace(minute=0, second=0, microsecond=0)
    minute = now.replace(second=0, microsecond=0)
    per_tenant: dict[str, int] = {}
    for (tenant, model, replica), more in counted.items():
        _add(
            Usage,
            {"tenant": tenant, "model": model, "replica": replica, "hour": hour},
            {
                "requests": more.requests,
                "prompt_tokens": more.prompt_tokens,
                "completion_tokens": more.completion_tokens,
            },
        )
        per_tenant[tenant] = per_tenant.get(tenant, 0) + more.prompt_tokens + more.completion_tokens
    for tenant, tokens in per_tenant.items():
        _add(TokenMinute, {"tenant": tenant, "minute": minute}, {"tokens": tokens})
    TokenMinute.objects.filter(minute__lt=minute - timedelta(minutes=1)).delete()


def _add(model, row: dict, amounts: dict[str, int]) -> None:
    increments = {name: F(name) + amount for name, amount in amounts.items()}
    if model.objects.filter(**row).update(**increments):
        return
    try:
        with transaction.atomic():
            model.objects.create(**row, **amounts)
    except IntegrityError:  # another gateway's sync made the row in between
        model.objects.filter(**row).update(**increments)
