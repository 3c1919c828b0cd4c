"""Tenants' usage as the operators' API answers it: tokens per tenant, model and replica since a time."""

from __future__ import annotations

import re
from datetime import timedelta

from rest_framework import serializers

SINCE = re.compile(r"^(\d{1,5})([mhd])\Z")
UNITS = {"m": "minutes", "h": "hours", "d": "days"}


class UsageParams(serializers.Serializer):
    tenant = serializers.CharField(required=False, max_length=64, help_text="Only this tenant's usage.")
    since = serializers.CharField(
        required=False, default="24h", help_text="How far back: minutes, hours or days, e.g. 90m, 24h, 30d (24h)."
    )

    def validate_since(self, value: str) -> timedelta:
        found = SINCE.match(value)
        if not found:
            raise serializers.ValidationError("a number and a unit: m, h or d (e.g. 24h)")
        return timedelta(**{UNITS[found[2]]: int(found[1])})


class UsageRowSerializer(serializers.Serializer):
    tenant = serializers.CharField()
    model = serializers.CharField(help_text="The served model name.")
    replica = serializers.CharField()
    requests = serializers.IntegerField()
    prompt_tokens = serializers.IntegerField()
    completion_tokens = serializers.IntegerField()


class UsageSerializer(serializers.Serializer):
    since = serializers.DateTimeField(help_text="The start of the first hour counted (usage is kept by the hour).")
    rows = UsageRowSerializer(many=True)
