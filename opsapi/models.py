"""Personal API tokens: a person's credential for scripts and the `llmgw` command.

Only a digest of the secret is kept; the token is shown once, when it is made.
A token acts for its user and never beyond them: `operate` is for staff only,
and every request checks the user's permissions again, so a user who loses
staff rights loses what their old tokens could do.
"""

from __future__ import annotations

import secrets
from datetime import timedelta

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import models
from django.utils import timezone

from nodes.models import digest, digest_matches, new_secret, split_token

# Tokens begin with this, so a secret scanner (or a person) can tell one in a paste.
PREFIX = "llmgw-ops-"
KEY_LENGTH = 16
MAX_LIFETIME = timedelta(days=365)
# last_used_at is a hint for the owner, not an audit trail (the admin log is
# that); writing it at most once a minute spares the database a write per request.
LAST_USED_RESOLUTION = timedelta(minutes=1)


class Scope(models.TextChoices):
    READ = "read", "read: look, never act"
    OPERATE = "operate", "operate: cordon, drain, deploy (staff only)"


class ApiTokenQuerySet(models.QuerySet):
    def usable(self, now=None) -> ApiTokenQuerySet:
        return self.filter(revoked_at__isnull=True, expires_at__gt=now or timezone.now())


class ApiToken(models.Model):
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="api_tokens")
    name = models.CharField(max_length=100, help_text="What the token is for, e.g. the laptop or the script.")
    key = models.CharField(max_length=KEY_LENGTH, unique=True, editable=False)
    secret_digest = models.CharField(max_length=64, editable=False)
    scope = models.CharField(max_length=16, choices=Scope.choices, default=Scope.READ)
    created_at = models.DateTimeField(default=timezone.now, editable=False)
    expires_at = models.DateTimeField()
    revoked_at = models.DateTimeField(null=True, blank=True, editable=False)
    revoked_by = models.CharField(max_length=150, blank=True, editable=False)
    last_used_at = models.DateTimeField(null=True, blank=True, editable=False)

    objects = ApiTokenQuerySet.as_manager()

    class Meta:
        ordering = ["-created_at"]
        verbose_name = "API token"

    def __str__(self) -> str:
        return f"{self.name} ({self.key})"

    def clean(self) -> None:
        if self.scope == Scope.OPERATE and self.user_id and not self.user.is_staff:
            raise ValidationError({"scope": "only staff may make operate tokens"})
        if self.expires_at and self.expires_at > (self.created_at or timezone.now()) + MAX_LIFETIME:
            raise ValidationError({"expires_at": f"at most {MAX_LIFETIME.days} days from now"})
        if self.expires_at and self.expires_at <= timezone.now() and self._state.adding:
            raise ValidationError({"expires_at": "must be in the future"})

    def issue(self) -> str:
        """Give this unsaved token its key and secret; returns the token, to show once."""
        self.key = secrets.token_hex(KEY_LENGTH // 2)
        secret = new_secret()
        self.secret_digest = digest(secret)
        return f"{PREFIX}{self.key}.{secret}"

    @property
    def revoked(self) -> bool:
        return self.revoked_at is not None

    @property
    def expired(self) -> bool:
        return self.expires_at <= timezone.now()

    @property
    def label(self) -> str:
        """How history names the token: its name and key, never the secret."""
        return f"{self.name} ({self.key})"

    def revoke(self, by: str) -> bool:
        if self.revoked:
            return False
        self.revoked_at = timezone.now()
        self.revoked_by = by
        self.save(update_fields=["revoked_at", "revoked_by"])
        return True

    def touch(self, now=None) -> None:
        """Note the use, at most once a minute: the row was just read, so most requests write nothing."""
        now = now or timezone.now()
        if self.last_used_at is not None and self.last_used_at >= now - LAST_USED_RESOLUTION:
            return
        stale = models.Q(last_used_at__isnull=True) | models.Q(last_used_at__lt=now - LAST_USED_RESOLUTION)
        ApiToken.objects.filter(stale, pk=self.pk).update(last_used_at=now)
        self.last_used_at = now

    @classmethod
    def find(cls, token: str) -> ApiToken | None:
        """The usable token this is, with its user, if any."""
        lookup, secret = split_token(token)
        key = lookup.removeprefix(PREFIX)
        if lookup == key or len(key) != KEY_LENGTH or not key.isalnum():
            return None
        found = cls.objects.usable().select_related("user").filter(key=key).first()
        if found is None or not found.user.is_active or not digest_matches(secret, found.secret_digest):
            return None
        return found
