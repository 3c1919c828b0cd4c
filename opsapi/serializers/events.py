"""Node events since a cursor, and who the caller is."""

from __future__ import annotations

from rest_framework import serializers

from opsapi.models import Scope
from opsapi.serializers.common import no_nul
from opsapi.serializers.nodes import EventSerializer

MAX_EVENTS = 500


class EventParams(serializers.Serializer):
    since = serializers.IntegerField(
        required=False, min_value=0, help_text="A cursor from an earlier answer; without it, the latest events."
    )
    node = serializers.CharField(required=False, max_length=128, validators=[no_nul], help_text="One node's only.")
    limit = serializers.IntegerField(required=False, default=100, min_value=1, max_value=MAX_EVENTS)


class EventPageSerializer(serializers.Serializer):
    cursor = serializers.IntegerField(help_text="Pass as `since` to get what happened after these.")
    more = serializers.BooleanField(help_text="More events are waiting past this cursor.")
    events = EventSerializer(many=True, help_text="Oldest first.")


class TokenInfoSerializer(serializers.Serializer):
    name = serializers.CharField()
    key = serializers.CharField()
    scope = serializers.ChoiceField(choices=Scope.choices)
    expires_at = serializers.DateTimeField()


class MeSerializer(serializers.Serializer):
    user = serializers.CharField()
    staff = serializers.BooleanField()
    token = TokenInfoSerializer()
