"""Tenants and their API keys, as the gateway checks them.

A key's secret is shown once, when it is made; only its SHA-256 digest is kept, and that
digest is what HAProxy looks up (`req.hdr(authorization)` → `sha2(256),hex,lower` → the
key map), so a request is admitted without Python in its path. A tenant's limits go the same
way: the sync writes them into maps keyed by tenant, and HAProxy compares each tenant's
counters in a stick table against them (docs/gateway.md, "Tenants: limits, usage, budgets").
"""

from __future__ import annotations

import secrets

from django.core.exceptions import ValidationError
from django.core.validators import RegexValidator
from django.db import models
from django.db.models import Q
from django.utils import timezone

from gateway.haproxy_config import key_digest

# Keys begin with this, so a secret scanner (or a person) can tell one in a paste.
PREFIX = "llmgw-sk-"
# The characters of a key shown in lists: enough to tell keys apart, too few to use.
DISPLAY_LENGTH = len(PREFIX) + 6

# A tenant's name is written into HAProxy's key map as the value a key maps to, and into
# its logs: one word of a safe alphabet.
TENANT_NAME_VALIDATOR = RegexValidator(
    r"^[a-z0-9][a-z0-9._-]*\Z",
    "lower-case letters, digits, '.', '_' and '-', starting with a letter or digit",
)


class Tenant(models.Model):
    """Someone who sends requests through the gateway: a team, a product, a customer."""

    name = models.CharField(max_length=64, unique=True, validators=[TENANT_NAME_VALIDATOR])
    active = models.BooleanField(default=True, help_text="An inactive tenant's keys are refused at the gateway.")
    created_at = models.DateTimeField(default=timezone.now, editable=False)
    # Empty: no limit. Zero refuses every request (a tenant held back without revoking its keys).
    requests_per_second = models.PositiveIntegerField(
        null=True, blank=True, help_text="Requests admitted per second, on each gateway; empty: no limit."
    )
    concurrent_requests = models.PositiveIntegerField(
        null=True, blank=True, help_text="Requests in flight at once, on each gateway; empty: no limit."
    )
    # Token budgets count what the engines reported (prompt and completion), across every gateway;
    # minutes and days are UTC's. Once spent, the next request is refused until the window ends.
    tokens_per_minute = models.PositiveBigIntegerField(
        null=True, blank=True, help_text="Tokens per minute (UTC), on all gateways together; empty: no budget."
    )
    tokens_per_day = models.PositiveBigIntegerField(
        null=True,
        blank=True,
        help_text="Tokens per day (UTC, from midnight), on all gateways together; empty: no budget.",
    )

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name


class ApiKeyQuerySet(models.QuerySet):
    def usable(self, now=None) -> ApiKeyQuerySet:
        """Keys the gateway admits: not revoked, not expired, of an active tenant."""
        now = now or timezone.now()
        return self.filter(
            Q(expires_at__isnull=True) | Q(expires_at__gt=now), revoked_at__isnull=True, tenant__active=True
        )


class ApiKey(models.Model):
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="keys")
    name = models.CharField(max_length=100, blank=True, help_text="What the key is for, e.g. the service using it.")
    prefix = models.CharField(max_length=DISPLAY_LENGTH, editable=False, help_text="The key's first characters.")
    digest = models.CharField(max_length=64, unique=True, editable=False)
    created_at = models.DateTimeField(default=timezone.now, editable=False)
    expires_at = models.DateTimeField(null=True, blank=True, help_text="Empty: never expires.")
    revoked_at = models.DateTimeField(null=True, blank=True, editable=False)
    revoked_by = models.CharField(max_length=150, blank=True, editable=False)

    objects = ApiKeyQuerySet.as_manager()

    class Meta:
        ordering = ["tenant", "-created_at"]
        verbose_name = "API key"

    def __str__(self) -> str:
        return f"{self.prefix}… ({self.tenant.name})"

    def clean(self) -> None:
        if self._state.adding and self.expires_at is not None and self.expires_at <= timezone.now():
            raise ValidationError({"expires_at": "must be in the future"})

    def issue(self) -> str:
        """Give this unsaved key its secret; returns the key, to show once."""
        key = PREFIX + secrets.token_urlsafe(32)
        self.prefix = key[:DISPLAY_LENGTH]
        self.digest = key_digest(key)
        return key

    def revoke(self, by: str) -> bool:
        """Revoke once; True when this call revoked it (a second revoke changes nothing)."""
        changed = ApiKey.objects.filter(pk=self.pk, revoked_at__isnull=True).update(
            revoked_at=timezone.now(), revoked_by=by[:150]
        )
        self.refresh_from_db(fields=["revoked_at", "revoked_by"])
        return bool(changed)

    @property
    def revoked(self) -> bool:
        return self.revoked_at is not None


class Usage(models.Model):
    """Tokens the engines reported for a tenant's requests to one replica of a model, in one hour (UTC).

    Keyed by names, not rows: usage outlives a tenant or a replica deleted since (bills are asked later).
    """

    tenant = models.CharField(max_length=64)
    model = models.CharField(max_length=128, help_text="The served model name.")
    replica = models.CharField(max_length=128, help_text="The replica (the gateway's server) that answered.")
    hour = models.DateTimeField(help_text="The hour's start, UTC.")
    requests = models.BigIntegerField(default=0)
    prompt_tokens = models.BigIntegerField(default=0)
    completion_tokens = models.BigIntegerField(default=0)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["tenant", "model", "replica", "hour"], name="usage_one_row_per_hour")
        ]
        indexes = [models.Index(fields=["tenant", "hour"])]

    def __str__(self) -> str:
        return f"{self.tenant} {self.model} {self.replica} {self.hour:%Y-%m-%d %H:00}"


class TokenMinute(models.Model):
    """A tenant's tokens in one UTC minute, all gateways together: what its per-minute budget is held to.

    Kept only for the current and the last minute (the sync deletes older rows).
    """

    tenant = models.CharField(max_length=64)
    minute = models.DateTimeField(help_text="The minute's start, UTC.")
    tokens = models.BigIntegerField(default=0)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["tenant", "minute"], name="token_minute_one_row")]

    def __str__(self) -> str:
        return f"{self.tenant} {self.minute:%Y-%m-%d %H:%M}"
