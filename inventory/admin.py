"""The operators' admin: nodes with their state, and cordon, drain and uncordon; GPUs, and marking one healthy.

What an agent reports is read-only here (the agent owns it and would overwrite
it); operators edit their own labels and notes, and change admin state only
through the actions, which ask for a reason and record it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import redis
from django import forms
from django.contrib import admin, messages
from django.db.models import Count, Exists, OuterRef, Prefetch, Q
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils import timezone
from django.utils.html import format_html

from agent.protocol import Load
from inventory import endpoints, gpuhealth
from inventory.models import (
    AGENT_FIELDS,
    CONDITION_COLOURS,
    GPU,
    LIVE_STATES,
    REPLICA_COLOURS,
    RUN_STATES,
    STATE_COLOURS,
    Allocation,
    Deployment,
    EngineInstall,
    FabricAttachment,
    Filesystem,
    GPUCondition,
    Node,
    NodeEvent,
    NodeState,
    Replica,
    ReplicaState,
    Shard,
    Weights,
)
from inventory.operator import ACTIONS, set_admin_state
from inventory.queries import count_per_node, gpu_class_filter, label_filter
from livestate import loadstore

log = logging.getLogger(__name__)


def state_badge(state: NodeState):
    return format_html('<span class="llmgw-badge llmgw-{}">{}</span>', STATE_COLOURS[state], state.label)


class StateFilter(admin.SimpleListFilter):
    title = "state"
    parameter_name = "state"

    def lookups(self, request, model_admin):
        return NodeState.choices

    def queryset(self, request, queryset):
        if self.value() in NodeState.values:
            return queryset.in_state(self.value())
        return queryset


class LabelFilter(admin.SimpleListFilter):
    title = "label"
    parameter_name = "label"

    def lookups(self, request, model_admin):
        pairs = set()
        for labels, operator_labels in Node.objects.values_list("labels", "operator_labels"):
            pairs.update(f"{k}={v}" for k, v in {**labels, **operator_labels}.items())
        return [(pair, pair) for pair in sorted(pairs)[:200]]

    def queryset(self, request, queryset):
        if not self.value() or "=" not in self.value():
            return queryset
        label_key, value = self.value().split("=", 1)
        return queryset.filter(label_filter(label_key, value))


class ValueFilter(admin.SimpleListFilter):
    """Offers each value a column holds across the fleet; choosing one keeps the nodes `matching` selects."""

    def values(self):
        raise NotImplementedError

    def matching(self, value: str) -> Q:
        raise NotImplementedError

    def lookups(self, request, model_admin):
        return [(value, value) for value in self.values().distinct()]

    def queryset(self, request, queryset):
        if self.value():
            return queryset.filter(self.matching(self.value()))
        return queryset


class GPUClassFilter(ValueFilter):
    title = "GPU class"
    parameter_name = "gpu_class"

    def values(self):
        return GPU.objects.values_list("gpu_class", flat=True).order_by("gpu_class")

    def matching(self, value: str) -> Q:
        return gpu_class_filter(value)


class FabricFilter(ValueFilter):
    title = "fabric"
    parameter_name = "fabric"

    def values(self):
        return FabricAttachment.objects.values_list("fabric", flat=True).order_by("fabric")

    def matching(self, value: str) -> Q:
        # Exists rather than a join, so a node on two matching attachments is listed once.
        return Q(Exists(FabricAttachment.objects.filter(node=OuterRef("pk"), fabric=value)))


class ReadOnlyInline(admin.TabularInline):
    extra = 0
    can_delete = False
    show_change_link = False

    def has_add_permission(self, request, obj=None):
        return False

    def has_change_permission(self, request, obj=None):
        return False


def condition_badge(condition: str):
    condition = GPUCondition(condition)
    return format_html('<span class="llmgw-badge llmgw-{}">{}</span>', CONDITION_COLOURS[condition], condition.label)


class GPUInline(ReadOnlyInline):
    model = GPU
    fields = ("index", "name", "gpu_class", "memory_bytes", "ecc_errors", "health", "condition", "uuid")
    readonly_fields = fields
    # Its own page holds the one GPU action: marking it healthy again.
    show_change_link = True


class FilesystemInline(ReadOnlyInline):
    model = Filesystem
    fields = ("mount", "fstype", "free_bytes", "total_bytes", "shared")
    readonly_fields = fields


class FabricInline(ReadOnlyInline):
    model = FabricAttachment
    fields = ("fabric", "hcas", "rate_gbps")
    readonly_fields = fields


class WeightsInline(ReadOnlyInline):
    model = Weights
    fields = ("path", "format", "size_bytes")
    readonly_fields = fields


class EngineInstallInline(ReadOnlyInline):
    model = EngineInstall
    fields = ("engine", "version", "variant", "state_display", "detail_display")
    readonly_fields = fields
    verbose_name_plural = "engine installs (as the agent reports them)"

    @admin.display(description="state")
    def state_display(self, install):
        return format_html('<span class="llmgw-install-{}">{}</span>', install.state, install.state)

    @admin.display(description="detail")
    def detail_display(self, install):
        # A failed install's detail is the tail of its log: its lines matter, and it is the agent's text.
        if install.state == EngineInstall.State.FAILED and install.detail:
            return format_html('<pre class="llmgw-log-tail"><bdi>{}</bdi></pre>', install.detail)
        return format_html("<bdi>{}</bdi>", install.detail) if install.detail else "—"


class AllocationInline(ReadOnlyInline):
    model = Allocation
    fields = ("shard_id", "replica_id", "gpus", "memory_gb", "created_at")
    readonly_fields = fields

    def get_queryset(self, request):
        return super().get_queryset(request).prefetch_related("gpu_claims")

    @admin.display(description="GPUs")
    def gpus(self, allocation):
        return ", ".join(str(i) for i in allocation.gpu_indices) or "—"


class NodeEventInline(ReadOnlyInline):
    model = NodeEvent
    fields = ("at", "kind", "from_state", "to_state", "reason", "actor")
    readonly_fields = fields
    verbose_name_plural = "history"

    def get_queryset(self, request):
        return super().get_queryset(request).order_by("-at", "-id")


class ReasonForm(forms.Form):
    reason = forms.CharField(widget=forms.Textarea(attrs={"rows": 3, "cols": 60}), max_length=2000)


# What the agent reports, then what heartbeats and operator actions set: none
# of it is edited in a form.
REPORTED = ("id", *AGENT_FIELDS)
READ_ONLY = (
    *REPORTED,
    "liveness",
    "last_heartbeat",
    "registered_at",
    "admin_state",
    "admin_state_by",
    "admin_state_at",
    "admin_state_reason",
)


def load_figure(node: Node, show: Callable[[Load], str]) -> str:
    """A figure from the node's current load; a dash when Redis had none (or was not reachable)."""
    stored = getattr(node, "current_load", None)
    return "—" if stored is None else show(stored.load)


def ram_used(load: Load) -> str:
    total = load.memory_used_bytes + load.memory_available_bytes
    return f"{load.memory_used_bytes / 2**30:.1f} / {total / 2**30:.1f} GiB"


@admin.register(Node)
class NodeAdmin(admin.ModelAdmin):
    list_display = ("id", "state_display", "hostname", "gpus_display", "cpu_display", "ram_display", "heartbeat_age")
    list_filter = (StateFilter, LabelFilter, FabricFilter, GPUClassFilter)
    search_fields = ("id", "hostname")
    actions = ("cordon", "drain", "uncordon")
    readonly_fields = READ_ONLY
    fieldsets = (
        (
            "Operator",
            {
                "fields": (
                    "admin_state",
                    "admin_state_by",
                    "admin_state_at",
                    "admin_state_reason",
                    "operator_labels",
                    "notes",
                )
            },
        ),
        ("Liveness", {"fields": ("liveness", "last_heartbeat", "registered_at")}),
        ("Reported by the agent", {"fields": REPORTED}),
    )
    inlines = (
        AllocationInline,
        GPUInline,
        FilesystemInline,
        FabricInline,
        WeightsInline,
        EngineInstallInline,
        NodeEventInline,
    )
    list_per_page = 100

    def has_add_permission(self, request):
        # Nodes join by registering with a join token, never by hand.
        return False

    def get_queryset(self, request):
        return (
            super()
            .get_queryset(request)
            .annotate(gpu_total=count_per_node(GPU.objects.all()), gpu_free=count_per_node(GPU.objects.free()))
        )

    def get_changelist_instance(self, request):
        changelist = super().get_changelist_instance(request)
        # One Redis round trip for the page; a dead Redis costs the load columns only.
        try:
            loads = loadstore.fetch([node.pk for node in changelist.result_list])
        except redis.RedisError as exc:
            log.warning("admin node list without loads: %s", exc)
            loads = {}
        for node in changelist.result_list:
            node.current_load = loads.get(node.pk)
        return changelist

    @admin.display(description="state")
    def state_display(self, node):
        return state_badge(node.state)

    @admin.display(description="GPUs free/total")
    def gpus_display(self, node):
        total = getattr(node, "gpu_total", None)
        if total is None:
            return "—"
        return f"{node.gpu_free}/{total}"

    @admin.display(description="CPU")
    def cpu_display(self, node):
        return load_figure(node, lambda load: f"{load.cpu_percent:.0f}% of {load.cpus}")

    @admin.display(description="RAM used")
    def ram_display(self, node):
        return load_figure(node, ram_used)

    @admin.display(description="last heartbeat", ordering="last_heartbeat")
    def heartbeat_age(self, node):
        if node.last_heartbeat is None:
            return "never"
        seconds = int((timezone.now() - node.last_heartbeat).total_seconds())
        return f"{seconds} s ago"

    def _apply(self, request, queryset, action: str):
        new_state = ACTIONS[action]
        if "apply" in request.POST:
            form = ReasonForm(request.POST)
            if form.is_valid():
                changed = sum(
                    set_admin_state(node, new_state, request.user, form.cleaned_data["reason"]) for node in queryset
                )
                self.message_user(request, f"{action}: {changed} node(s) changed.", messages.SUCCESS)
                return None
        else:
            form = ReasonForm()
        return TemplateResponse(
            request,
            "admin/inventory/node_action.html",
            {
                **self.admin_site.each_context(request),
                "title": f"{action.capitalize()} nodes",
                "action": action,
                "nodes": queryset,
                "form": form,
                "opts": self.model._meta,
                "action_checkbox_name": admin.helpers.ACTION_CHECKBOX_NAME,
            },
        )

    @admin.action(description="Cordon: no new placement", permissions=["change"])
    def cordon(self, request, queryset):
        return self._apply(request, queryset, "cordon")

    @admin.action(description="Drain: move replicas off, then cordon", permissions=["change"])
    def drain(self, request, queryset):
        return self._apply(request, queryset, "drain")

    @admin.action(description="Uncordon: accept placement again", permissions=["change"])
    def uncordon(self, request, queryset):
        return self._apply(request, queryset, "uncordon")


@admin.register(GPU)
class GPUAdmin(admin.ModelAdmin):
    """Every GPU with the control plane's verdict; an operator marks a degraded or failed one healthy again."""

    list_display = ("__str__", "condition_display", "condition_reason", "condition_since", "health")
    list_filter = ("condition", "gpu_class")
    search_fields = ("node__id", "uuid")
    list_select_related = ("node",)
    actions = ("mark_healthy",)
    fields = (
        "node",
        "index",
        "uuid",
        "name",
        "gpu_class",
        "memory_bytes",
        "ecc_errors",
        "health",
        "condition",
        "condition_reason",
        "condition_since",
    )
    # The agent owns some fields and gpuhealth the others: the action is the only way to change one.
    readonly_fields = fields

    def has_add_permission(self, request):
        return False

    def has_delete_permission(self, request, obj=None):
        return False

    @admin.display(description="condition", ordering="condition")
    def condition_display(self, gpu):
        return condition_badge(gpu.condition)

    @admin.action(description="Mark healthy: back into placement", permissions=["change"])
    def mark_healthy(self, request, queryset):
        if "apply" in request.POST:
            form = ReasonForm(request.POST)
            if form.is_valid():
                reason = form.cleaned_data["reason"]
                changed = 0
                for gpu in queryset:
                    if gpuhealth.clear(gpu, request.user.get_username(), reason):
                        self.log_change(request, gpu, f"{gpu.condition} → healthy: {reason}")
                        changed += 1
                self.message_user(request, f"mark healthy: {changed} GPU(s) changed.", messages.SUCCESS)
                return None
        else:
            form = ReasonForm()
        return TemplateResponse(
            request,
            "admin/inventory/gpu_action.html",
            {
                **self.admin_site.each_context(request),
                "title": "Mark GPUs healthy",
                "gpus": queryset,
                "form": form,
                "opts": self.model._meta,
                "action_checkbox_name": admin.helpers.ACTION_CHECKBOX_NAME,
            },
        )


@admin.register(NodeEvent)
class NodeEventAdmin(admin.ModelAdmin):
    list_display = ("at", "node", "kind", "from_state", "to_state", "reason", "actor", "repeats", "last_at")
    list_filter = ("kind",)
    search_fields = ("node__id", "reason", "actor")
    list_select_related = ("node",)

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False


@admin.register(Allocation)
class AllocationAdmin(admin.ModelAdmin):
    list_display = ("shard_id", "replica_id", "node", "gpus", "memory_gb", "created_at")
    search_fields = ("shard_id", "replica_id", "node__id")
    list_select_related = ("node",)

    def get_queryset(self, request):
        return super().get_queryset(request).prefetch_related("gpu_claims")

    @admin.display(description="GPUs")
    def gpus(self, allocation):
        return ", ".join(str(i) for i in allocation.gpu_indices) or "—"

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False


def replica_badge(state: str):
    return format_html('<span class="llmgw-badge llmgw-{}">{}</span>', REPLICA_COLOURS[ReplicaState(state)], state)


class ReplicaInline(ReadOnlyInline):
    model = Replica
    fk_name = "deployment"
    fields = ("replica_link", "state_display", "reason", "shards_display", "changed_at")
    readonly_fields = fields
    verbose_name_plural = "replicas (why each is where it is)"

    def get_queryset(self, request):
        return super().get_queryset(request).prefetch_related("shards").order_by("ordinal")

    @admin.display(description="replica")
    def replica_link(self, replica):
        url = reverse("admin:inventory_replica_change", args=[replica.pk])
        return format_html('<a href="{}">{}</a>', url, replica.replica_id)

    @admin.display(description="state")
    def state_display(self, replica):
        return replica_badge(replica.state)

    @admin.display(description="shards")
    def shards_display(self, replica):
        return shard_summary(replica.shards.all())


def shard_summary(shards) -> str:
    """Each shard as node:GPUs, or a dash while the replica waits for a place."""
    parts = []
    for shard in shards:
        gpus = ",".join(str(i) for i in shard.gpu_indices)
        parts.append(f"{shard.node_id}" + (f" GPUs {gpus}" if gpus else "") + f" ({shard.state})")
    return "; ".join(parts) or "—"


@admin.register(Deployment)
class DeploymentAdmin(admin.ModelAdmin):
    list_display = (
        "name",
        "served_model_name",
        "engine",
        "model_source",
        "replicas",
        "running_display",
        "cannot_place",
    )
    list_filter = ("engine",)
    search_fields = ("name", "served_model_name", "model_source")
    inlines = (ReplicaInline,)
    fieldsets = (
        (
            None,
            {
                "fields": (
                    "name",
                    "served_model_name",
                    "prefix_affinity",
                    "max_in_flight_per_replica",
                    "model_source",
                    "engine",
                    "arguments",
                    "secret_arguments",
                    "replicas",
                )
            },
        ),
        (
            "Profile: what one shard needs",
            {
                "fields": (
                    "shards_per_replica",
                    "gpus_per_shard",
                    "gpu_class",
                    "memory_gb_per_shard",
                    "cpu_cores_per_shard",
                )
            },
        ),
    )

    def get_readonly_fields(self, request, obj=None):
        # Replica and shard ids are built from the name, and agents know them.
        return ("name", "hidden_arguments") if obj is not None else ()

    def get_fieldsets(self, request, obj=None):
        fieldsets = super().get_fieldsets(request, obj)
        if obj is None or not obj.hides_arguments_from(self.has_change_permission(request, obj)):
            return fieldsets
        swapped = {"arguments": "hidden_arguments"}
        return [
            (title, {**options, "fields": tuple(swapped.get(name, name) for name in options["fields"])})
            for title, options in fieldsets
        ]

    @admin.display(description="arguments")
    def hidden_arguments(self, obj: Deployment) -> str:
        return obj.arguments_for(may_change=False)

    def get_queryset(self, request):
        pending = Replica.objects.filter(state=ReplicaState.PENDING).order_by("ordinal")
        return (
            super()
            .get_queryset(request)
            .annotate(
                live=Count("replica_set", filter=Q(replica_set__state__in=LIVE_STATES), distinct=True),
                running=Count("replica_set", filter=Q(replica_set__state=ReplicaState.RUNNING), distinct=True),
            )
            .prefetch_related(Prefetch("replica_set", queryset=pending, to_attr="pending"))
        )

    @admin.display(description="running")
    def running_display(self, deployment):
        return f"{deployment.running} of {deployment.replicas}"

    @admin.display(description="cannot place")
    def cannot_place(self, deployment):
        reasons = sorted({r.reason.removeprefix("cannot place: ") for r in deployment.pending if r.reason})
        if not reasons:
            return "—"
        count = len(deployment.pending)
        return format_html('<span class="llmgw-cannot-place">{} waiting: {}</span>', count, "; ".join(reasons))


class ShardInline(ReadOnlyInline):
    model = Shard
    fields = (
        "shard_id",
        "node",
        "state",
        "reason",
        "gpu_indices",
        "hcas",
        "port",
        "endpoint",
        "metrics_port",
        "changed_at",
    )
    readonly_fields = fields

    def get_queryset(self, request):
        return super().get_queryset(request).select_related("node")

    @admin.display(description="endpoint (OpenAI API)")
    def endpoint(self, shard):
        address = shard.node.address if shard.node is not None else None
        if address is None or shard.state not in RUN_STATES:
            return "—"
        return format_html("<code>{}</code>", endpoints.endpoint(address, shard.port))


@admin.register(Replica)
class ReplicaAdmin(admin.ModelAdmin):
    list_display = ("replica_id", "deployment", "state_display", "reason", "changed_at")
    list_filter = ("state", "deployment")
    search_fields = ("replica_id", "shards__node__id")
    list_select_related = ("deployment",)
    inlines = (ShardInline,)
    readonly_fields = ("deployment", "replica_id", "ordinal", "state", "reason", "fabric", "replaces", "changed_at")
    fields = readonly_fields

    @admin.display(description="state")
    def state_display(self, replica):
        return replica_badge(replica.state)

    def has_add_permission(self, request):
        # The reconciler makes replicas; operators change the number wanted.
        return False

    def has_change_permission(self, request, obj=None):
        return False
