"""Tokens counted at the gateway, handed over to the database: per tenant, model, replica and hour.

HAProxy's Lua filter (deploy/gateway_usage.lua) adds up each answer's `usage` as the engine
reported it; each sync pass takes those totals over the admin socket (`llmgw usage take`, which
zeroes them) and adds them to `Usage` rows. What could not be written stays with the sync
for its next pass, so a database that is down loses nothing while the sync runs.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

from django.db import IntegrityError, transaction
from django.db.models import F
from django.utils import timezone

from gateway.models import TokenMinute, Usage
from gateway.runtime import Runtime


@dataclass
class Counted:
    requests: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0

    def add(self, other: Counted) -> None:
        self.requests += other.requests
        self.prompt_tokens += other.prompt_tokens
        self.completion_tokens += other.completion_tokens


# (tenant, served model, replica): what one gateway counted for them.
Key = tuple[str, str, str]


def take(runtime: Runtime) -> dict[Key, Counted]:
    """What HAProxy counted since the last take; HAProxy starts again from zero."""
    taken: dict[Key, Counted] = {}
    for line in runtime.ask("llmgw usage take").splitlines():
        fields = line.split()
        if len(fields) != 6 or not all(f.isdigit() for f in fields[3:]):
            continue
        tenant, model, replica, requests, prompt, completion = fields
        taken.setdefault((tenant, model, replica), Counted()).add(Counted(int(requests), int(prompt), int(completion)))
    return taken


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
