"""The form a user makes a token with on the Tokens page."""

from __future__ import annotations

from datetime import timedelta

from django import forms
from django.utils import timezone

from opsapi.models import MAX_LIFETIME, ApiToken, Scope

LIFETIMES = [(7, "7 days"), (30, "30 days"), (90, "90 days"), (MAX_LIFETIME.days, f"{MAX_LIFETIME.days} days")]


class NewTokenForm(forms.Form):
    name = forms.CharField(max_length=100, help_text="What it is for: the laptop, the script.")
    scope = forms.ChoiceField(choices=Scope.choices, initial=Scope.READ)
    lifetime_days = forms.TypedChoiceField(choices=LIFETIMES, coerce=int, initial=30, label="expires in")

    def __init__(self, *args, user, **kwargs):
        super().__init__(*args, **kwargs)
        self.user = user
        if not user.is_staff:
            self.fields["scope"].choices = [(Scope.READ, Scope.READ.label)]

    def clean_name(self) -> str:
        name = self.cleaned_data["name"].replace("\x00", "").strip()
        if not name:
            raise forms.ValidationError("a name is required")
        return name

    def make(self) -> tuple[ApiToken, str]:
        """The new token, saved, and its secret to show once."""
        now = timezone.now()
        token = ApiToken(
            user=self.user,
            name=self.cleaned_data["name"],
            scope=self.cleaned_data["scope"],
            created_at=now,
            expires_at=now + timedelta(days=self.cleaned_data["lifetime_days"]),
        )
        secret = token.issue()
        token.full_clean(exclude=["key", "secret_digest"])
        token.save()
        return token, secret
