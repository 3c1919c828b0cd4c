"""Cordon, drain and uncordon for one node or many."""

from __future__ import annotations

from rest_framework import serializers

from inventory.models import AdminState, NodeState
from opsapi.serializers.common import no_nul

MAX_NODES = 1000
MAX_REASON = 2000
MAX_SELECTOR = 500


class NodeActionInput(serializers.Serializer):
    action = serializers.ChoiceField(choices=["cordon", "drain", "uncordon"])
    reason = serializers.CharField(
        max_length=MAX_REASON, validators=[no_nul], help_text="Required: the next operator will want to know why."
    )
    nodes = serializers.ListField(
        child=serializers.CharField(max_length=128, validators=[no_nul]),
        required=False,
        min_length=1,
        max_length=MAX_NODES,
        help_text="Node ids; or give `selector`.",
    )
    selector = serializers.CharField(
        required=False,
        max_length=MAX_SELECTOR,
        validators=[no_nul],
        help_text="Labels the nodes must all have, kubectl's way: rack=r12,zone=a.",
    )

    def validate_selector(self, value: str) -> list[tuple[str, str]]:
        pairs = []
        for part in value.split(","):
            key, equals, wanted = part.partition("=")
            if not equals or not key.strip():
                raise serializers.ValidationError(f"{part.strip()!r} is not key=value")
            pairs.append((key.strip(), wanted.strip()))
        return pairs

    def validate(self, attrs: dict) -> dict:
        if ("nodes" in attrs) == ("selector" in attrs):
            raise serializers.ValidationError({"nodes": "give either nodes (a list of ids) or selector, not both"})
        return attrs


class NodeActionResult(serializers.Serializer):
    node = serializers.CharField()
    changed = serializers.BooleanField(help_text="False when the node was already in that state.")
    admin_state = serializers.ChoiceField(choices=AdminState.choices)
    state = serializers.ChoiceField(choices=NodeState.choices)


class NodeActionOutput(serializers.Serializer):
    action = serializers.CharField()
    reason = serializers.CharField()
    changed = serializers.IntegerField()
    results = NodeActionResult(many=True)
