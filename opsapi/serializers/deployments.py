"""Deployments with their replicas, shards, and why a replica waits."""

from __future__ import annotations

from rest_framework import serializers

from inventory.models import Deployment, Engine, ReplicaState
from opsapi.serializers.common import PagedSerializer

PROFILE_FIELDS = ("shards_per_replica", "gpus_per_shard", "gpu_class", "memory_gb_per_shard", "cpu_cores_per_shard")


class DeploymentInput(serializers.ModelSerializer):
    """A new deployment; the model's own validators and `clean` apply."""

    class Meta:
        model = Deployment
        fields = (
            "name",
            "served_model_name",
            "prefix_affinity",
            "max_in_flight_per_replica",
            "model_source",
            "engine",
            "arguments",
            "secret_arguments",
            "replicas",
            *PROFILE_FIELDS,
        )


class ScaleInput(serializers.Serializer):
    replicas = serializers.IntegerField(min_value=0, max_value=10_000, help_text="Replicas wanted.")


class ShardSerializer(serializers.Serializer):
    shard_id = serializers.CharField()
    index = serializers.IntegerField()
    node = serializers.CharField(allow_null=True)
    state = serializers.ChoiceField(choices=ReplicaState.choices)
    reason = serializers.CharField()
    gpus = serializers.ListField(child=serializers.IntegerField())
    port = serializers.IntegerField()


class ReplicaSerializer(serializers.Serializer):
    replica_id = serializers.CharField()
    ordinal = serializers.IntegerField()
    state = serializers.ChoiceField(choices=ReplicaState.choices)
    reason = serializers.CharField(help_text="Why it is in this state; for a pending one, why it is not placed.")
    changed_at = serializers.DateTimeField()
    fabric = serializers.CharField()
    replaces = serializers.CharField(allow_null=True, help_text="The replica it moves off a draining node.")
    shards = ShardSerializer(many=True)


class NotPlacedSerializer(serializers.Serializer):
    replica = serializers.CharField()
    reason = serializers.CharField()


class DeploymentSerializer(serializers.Serializer):
    name = serializers.CharField()
    served_model_name = serializers.CharField(help_text="What clients send as `model` through the gateway.")
    prefix_affinity = serializers.BooleanField(
        help_text="Requests that start alike go to the same replica, within a bound on its load."
    )
    max_in_flight_per_replica = serializers.IntegerField(
        allow_null=True,
        help_text="Requests each gateway sends one replica at once; beyond it the gateway queues them, tenants "
        "under their fair share first. Null: no limit.",
    )
    model_source = serializers.CharField()
    engine = serializers.ChoiceField(choices=Engine.choices)
    arguments = serializers.CharField(help_text="Secret arguments are shown only to a caller who may change them.")
    secret_arguments = serializers.BooleanField()
    replicas_wanted = serializers.IntegerField()
    replicas_running = serializers.IntegerField()
    shards_per_replica = serializers.IntegerField()
    gpus_per_shard = serializers.IntegerField()
    gpu_class = serializers.CharField()
    memory_gb_per_shard = serializers.IntegerField()
    cpu_cores_per_shard = serializers.IntegerField()
    profile = serializers.CharField(help_text="The profile in words.")
    created_at = serializers.DateTimeField()
    not_placed = NotPlacedSerializer(many=True, help_text="Pending replicas and why each is not placed.")
    replicas = ReplicaSerializer(many=True)


class DeploymentListSerializer(PagedSerializer):
    results = DeploymentSerializer(many=True)
