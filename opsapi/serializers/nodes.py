"""Nodes as the API shows them: a row of the list, the whole node, and drain progress."""

from __future__ import annotations

from rest_framework import serializers

from inventory.models import AdminState, Liveness, NodeState, ReplicaState
from nodes.filtersets import SORTS
from opsapi.serializers.common import PagedSerializer, PageParams, Text


class NodeListParams(PageParams):
    """The cluster page's parameters, same names; a wrong one is refused instead of ignored."""

    sort = serializers.ChoiceField(
        choices=SORTS + [f"-{s}" for s in SORTS], required=False, default="id", help_text="A column; '-' descends."
    )
    state = serializers.ChoiceField(choices=NodeState.choices, required=False, allow_blank=True, default="")
    label = Text(help_text="key=value, or a key that must be present.")
    gpu = Text(help_text="A GPU class, e.g. H100-80GB.")
    q = Text(help_text="Part of the id or the hostname.")


class LoadSerializer(serializers.Serializer):
    age_seconds = serializers.FloatField(help_text="Since the control plane received it.")
    cpu_percent = serializers.FloatField()
    cpus = serializers.IntegerField()
    load1 = serializers.FloatField()
    load5 = serializers.FloatField()
    load15 = serializers.FloatField()
    memory_used_bytes = serializers.IntegerField()
    memory_available_bytes = serializers.IntegerField()


class ShardLoadSerializer(serializers.Serializer):
    shard = serializers.CharField()
    cpu_cores = serializers.FloatField()
    rss_bytes = serializers.IntegerField()


class NodeLoadSerializer(LoadSerializer):
    shards = ShardLoadSerializer(many=True)


class GPUSummarySerializer(serializers.Serializer):
    total = serializers.IntegerField()
    free = serializers.IntegerField(help_text="Healthy and held by no shard.")
    classes = serializers.ListField(child=serializers.CharField())


class DiskSerializer(serializers.Serializer):
    free_bytes = serializers.IntegerField()
    total_bytes = serializers.IntegerField()


class NodeRowSerializer(serializers.Serializer):
    id = serializers.CharField()
    hostname = serializers.CharField()
    state = serializers.ChoiceField(choices=NodeState.choices)
    admin_state = serializers.ChoiceField(choices=AdminState.choices)
    liveness = serializers.ChoiceField(choices=Liveness.choices)
    labels = serializers.DictField(child=serializers.CharField())
    gpus = GPUSummarySerializer()
    disk = DiskSerializer(allow_null=True, help_text="Local (unshared) filesystems; null when none was reported.")
    engines = serializers.IntegerField(help_text="Shards placed on the node.")
    heartbeat_age_seconds = serializers.FloatField(allow_null=True)
    load = LoadSerializer(allow_null=True, help_text="Null when unknown or too old to show.")
    load_age_seconds = serializers.FloatField(allow_null=True, help_text="Age of the last load, even a stale one.")


class NodeListSerializer(PagedSerializer):
    load_problem = serializers.CharField(allow_null=True, help_text="Why loads are missing (Redis down), if so.")
    results = NodeRowSerializer(many=True)


class GPUSerializer(serializers.Serializer):
    index = serializers.IntegerField()
    uuid = serializers.CharField()
    name = serializers.CharField()
    gpu_class = serializers.CharField()
    memory_bytes = serializers.IntegerField()
    ecc_errors = serializers.IntegerField()
    health = serializers.CharField(help_text='"ok", or why the GPU must not be used.')
    held_by = serializers.CharField(allow_null=True, help_text="The shard holding it.")


class FilesystemSerializer(serializers.Serializer):
    mount = serializers.CharField()
    fstype = serializers.CharField()
    free_bytes = serializers.IntegerField()
    total_bytes = serializers.IntegerField()
    shared = serializers.BooleanField()


class FabricSerializer(serializers.Serializer):
    fabric = serializers.CharField()
    hcas = serializers.ListField(child=serializers.CharField())
    rate_gbps = serializers.IntegerField(help_text="The slowest active port; 0 when unknown.")


class EngineInstallSerializer(serializers.Serializer):
    engine = serializers.CharField()
    version = serializers.CharField()
    state = serializers.CharField()
    detail = serializers.CharField()


class AllocationSerializer(serializers.Serializer):
    shard = serializers.CharField()
    replica = serializers.CharField()
    model = serializers.CharField()
    gpus = serializers.ListField(child=serializers.IntegerField())
    memory_gb = serializers.IntegerField()
    cpu_cores = serializers.IntegerField()
    state = serializers.ChoiceField(choices=ReplicaState.choices, allow_null=True)


class EventSerializer(serializers.Serializer):
    id = serializers.IntegerField(help_text="Increasing; the events endpoint's cursor.")
    node = serializers.CharField()
    at = serializers.DateTimeField()
    kind = serializers.CharField()
    from_state = serializers.CharField()
    to_state = serializers.CharField()
    reason = serializers.CharField()
    actor = serializers.CharField()
    repeats = serializers.IntegerField(
        help_text="How many times it happened: the same change again within LLMGW_EVENT_COALESCE_SECONDS "
        "counts here (and moves last_at; the reason stays the first's) instead of making a new event."
    )
    last_at = serializers.DateTimeField(allow_null=True, help_text="When it last happened; null: once, at `at`.")


class DrainSerializer(serializers.Serializer):
    node = serializers.CharField()
    admin_state = serializers.ChoiceField(choices=AdminState.choices)
    state = serializers.ChoiceField(choices=NodeState.choices)
    replicas_left = serializers.IntegerField(help_text="Replicas still holding something on the node.")
    shards_left = serializers.IntegerField()
    drained = serializers.BooleanField(help_text="Cordoned with nothing left on it.")


class NodeDetailSerializer(serializers.Serializer):
    id = serializers.CharField()
    hostname = serializers.CharField()
    mgmt_addr = serializers.CharField(help_text="The management address its agent claims: shown, never connected to.")
    address = serializers.CharField(
        allow_null=True,
        help_text="Where the control plane and the node's peers reach it: the address its registrations came from, "
        "or its claimed one inside LLMGW_TRUSTED_TARGET_NETWORKS; null when neither.",
    )
    state = serializers.ChoiceField(choices=NodeState.choices)
    admin_state = serializers.ChoiceField(choices=AdminState.choices)
    admin_state_by = serializers.CharField()
    admin_state_at = serializers.DateTimeField(allow_null=True)
    admin_state_reason = serializers.CharField()
    liveness = serializers.ChoiceField(choices=Liveness.choices)
    schedulable = serializers.BooleanField()
    labels = serializers.DictField(child=serializers.CharField())
    notes = serializers.CharField()
    os = serializers.CharField()
    os_version = serializers.CharField()
    kernel = serializers.CharField()
    arch = serializers.CharField()
    cpu_model = serializers.CharField()
    cpus = serializers.IntegerField()
    memory_total_bytes = serializers.IntegerField(allow_null=True)
    agent_version = serializers.CharField()
    engine_versions = serializers.DictField(child=serializers.CharField())
    engines_probed = serializers.BooleanField()
    engine_installs = EngineInstallSerializer(many=True)
    registered_at = serializers.DateTimeField()
    last_heartbeat = serializers.DateTimeField(allow_null=True)
    heartbeat_age_seconds = serializers.FloatField(allow_null=True)
    load = NodeLoadSerializer(allow_null=True, help_text="Null when unknown or too old to show.")
    load_age_seconds = serializers.FloatField(allow_null=True)
    load_problem = serializers.CharField(allow_null=True)
    gpus = GPUSerializer(many=True)
    filesystems = FilesystemSerializer(many=True)
    fabrics = FabricSerializer(many=True)
    allocations = AllocationSerializer(many=True)
    drain = DrainSerializer(allow_null=True, help_text="Null unless the node is draining.")
    events = EventSerializer(many=True, help_text="The latest, newest first.")
