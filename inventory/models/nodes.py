"""Nodes: one machine each, its host facts, and the record of its state changes."""

from __future__ import annotations

from django.db import models
from django.utils import timezone

from agent.protocol import MAX_ID, MAX_TEXT
from inventory.endpoints import trusted_address
from inventory.models.choices import AdminState, Liveness, NodeState, TextChoices, derive_state, state_q

# The columns that hold what an agent reports take their lengths from the protocol's
# bounds (agent/protocol.py), here and in every inventory model: a report the
# protocol accepts always fits (issue 22: a 256-character `arch` in a 64-character
# column answered 500 on PostgreSQL).

# The node fields its agent owns: every inventory report replaces them, so the
# admin shows them read-only and registration writes exactly these. Operator
# fields (operator_labels, notes, admin state) are never in this list.
AGENT_FIELDS = (
    "hostname",
    "mgmt_addr",
    "labels",
    "memory_total_bytes",
    "os",
    "os_version",
    "kernel",
    "arch",
    "cpu_model",
    "cpus",
    "agent_version",
    "engine_versions",
    "engines_probed",
    "weights_scanned",
    "inventory_hash",
    "inventory_boot_id",
    "inventory_seq",
)


class NodeQuerySet(models.QuerySet):
    def in_state(self, *states: NodeState | str) -> NodeQuerySet:
        """Nodes shown in any of `states` (the rule is choices.STATE_RULES)."""
        condition = models.Q(pk__in=[])
        for state in states:
            condition |= state_q(state)
        return self.filter(condition)

    def schedulable(self) -> NodeQuerySet:
        """Nodes placement may put new shards on."""
        return self.in_state(NodeState.READY)


class Node(models.Model):
    """A machine in the fleet.

    The fields in AGENT_FIELDS are owned by the node's agent and replaced
    whenever it reports a new inventory.
    """

    id = models.CharField(primary_key=True, max_length=MAX_ID)
    hostname = models.CharField(max_length=MAX_TEXT, blank=True)
    mgmt_addr = models.CharField("management address", max_length=MAX_TEXT, blank=True)
    # Labels from the agent's config; replaced on every inventory report.
    labels = models.JSONField(default=dict, blank=True)
    # Labels set by operators in the admin; they win over the agent's on a clash.
    operator_labels = models.JSONField(default=dict, blank=True)
    notes = models.TextField(blank=True)
    # Null: the agent has not said. Treated as no constraint, never as zero.
    memory_total_bytes = models.BigIntegerField(null=True, blank=True)

    os = models.CharField(max_length=MAX_TEXT, blank=True)
    os_version = models.CharField(max_length=MAX_TEXT, blank=True)
    kernel = models.CharField(max_length=MAX_TEXT, blank=True)
    arch = models.CharField(max_length=MAX_TEXT, blank=True)
    cpu_model = models.CharField(max_length=MAX_TEXT, blank=True)
    cpus = models.PositiveIntegerField(default=0)

    agent_version = models.CharField(max_length=MAX_TEXT, blank=True)
    engine_versions = models.JSONField(default=dict, blank=True)
    # Says engine_versions is an answer: an empty map then means "has none".
    engines_probed = models.BooleanField(default=False)
    # Says the weights are an answer: the agent had model directories to look in.
    weights_scanned = models.BooleanField(default=False)
    inventory_hash = models.CharField(max_length=MAX_TEXT, blank=True)
    # The client address the node's latest registration or inventory came from: what the
    # control plane itself saw, unlike mgmt_addr, which the agent claims (nodes/targets.py).
    source_addr = models.GenericIPAddressField("source address", null=True, blank=True)
    # Which heartbeat the stored inventory came from: the agent run's boot id and its
    # number in that run ("" and 0: said nothing), so an older one is refused.
    inventory_boot_id = models.CharField(max_length=MAX_ID, blank=True)
    inventory_seq = models.PositiveBigIntegerField(default=0)

    admin_state = models.CharField(max_length=16, choices=AdminState.choices, default=AdminState.ACTIVE)
    admin_state_by = models.CharField("changed by", max_length=150, blank=True)
    admin_state_at = models.DateTimeField("changed at", null=True, blank=True)
    admin_state_reason = models.TextField("reason", blank=True)

    liveness = models.CharField(max_length=16, choices=Liveness.choices, default=Liveness.ALIVE)
    # On the control plane's clock, never the agent's. Written for the whole fleet
    # on every sweep (inventory.liveness.flush), so deliberately in no index: an
    # UPDATE that changes no indexed column is a HOT update on PostgreSQL, kept
    # on its page and pruned there without a VACUUM. The sweep's and the pages'
    # reads of it scan the table, which is small (docs/design.md, the sweep).
    last_heartbeat = models.DateTimeField(null=True, blank=True)
    registered_at = models.DateTimeField(default=timezone.now)

    objects = NodeQuerySet.as_manager()

    class Meta:
        ordering = ["id"]
        indexes = [models.Index(fields=["liveness"], name="inventory_node_liveness")]

    def __str__(self) -> str:
        return self.id

    def get_absolute_url(self) -> str:
        return f"/nodes/{self.id}/"

    @property
    def state(self) -> NodeState:
        return derive_state(self.admin_state, self.liveness)

    @property
    def address(self) -> str | None:
        """Where others reach this node: its trusted address, never its mere claim (inventory/endpoints.py)."""
        return trusted_address(self.mgmt_addr, self.source_addr)

    @property
    def all_labels(self) -> dict[str, str]:
        return {**self.labels, **self.operator_labels}

    @property
    def schedulable(self) -> bool:
        return self.state == NodeState.READY

    def engine_versions_in_use(self) -> dict[str, str]:
        """Each engine the node has and its version: an install its agent reports ready, else the probe's answer.

        The probe asks the usual binary on the agent's PATH (`llama-server --version`);
        an engine the agent installed lives under its state directory, where the probe
        never looks, and is the one shards run. So a ready install decides its
        engine's line, as "VERSION (VARIANT)", and the probe's "not installed" is
        shown only for an engine no install has made ready. Reads the installs
        through `engine_installs`, which the pages prefetch.
        """
        versions = dict(self.engine_versions)
        ready: dict[str, list[str]] = {}
        for install in self.engine_installs.all():
            if install.state == EngineInstall.State.READY:
                shown = f"{install.version} ({install.variant})" if install.variant else install.version
                ready.setdefault(install.engine, []).append(shown)
        for engine, shown in ready.items():
            versions[engine] = ", ".join(shown)
        return dict(sorted(versions.items()))

    def local_disk(self) -> tuple[int, int] | None:
        """(free, total) bytes on filesystems this node fills itself; None if unknown.

        Shared filesystems are left out: twenty nodes mounting one filer must not
        each believe they own its free terabyte. Nothing reported is unknown,
        which callers must not read as a full disk.
        """
        filesystems = list(self.filesystems.all())
        if not filesystems:
            return None
        local = [fs for fs in filesystems if not fs.shared]
        return sum(fs.free_bytes for fs in local), sum(fs.total_bytes for fs in local)


class NodeEvent(models.Model):
    """One change on a node: liveness, admin state, registration, a GPU, a replica, an engine or an install."""

    class Kind(TextChoices):
        LIVENESS = "liveness"
        ADMIN = "admin"
        REGISTRATION = "registration"
        # A GPU's condition moved (inventory.gpuhealth) or an operator cleared it.
        GPU = "gpu"
        # A replica placed on the node (or rebuilt there), released from it, or failed on it.
        REPLICA = "replica"
        # An engine the agent runs failed or restarted.
        ENGINE = "engine"
        # An engine install moved (installing, ready, failed, unsupported).
        INSTALL = "install"

    node = models.ForeignKey(Node, on_delete=models.CASCADE, related_name="events")
    at = models.DateTimeField(default=timezone.now, db_index=True)
    kind = models.CharField(max_length=16, choices=Kind.choices)
    from_state = models.CharField(max_length=16, blank=True)
    to_state = models.CharField(max_length=16, blank=True)
    reason = models.TextField(blank=True)
    actor = models.CharField(max_length=150, blank=True)
    # What within its kind the event is about (an install's engine and variant, an engine's shard),
    # for folding repeats into one event (inventory/events.py). Defaults in the database too, like
    # `repeats`: the sweep writes liveness events with its own INSERT (inventory/liveness.py).
    subject = models.CharField(max_length=2 * MAX_TEXT + 1, blank=True, db_default="")
    # How many times it happened, and when it last did (null: once, at `at`): the same change of the
    # same subject again within LLMGW_EVENT_COALESCE_SECONDS counts here instead of adding a row;
    # the reason is the first occurrence's.
    repeats = models.PositiveIntegerField(default=1, db_default=1)
    last_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-at", "-id"]

    def __str__(self) -> str:
        return f"{self.node_id}: {self.from_state} → {self.to_state}"


class EngineInstall(models.Model):
    """Where installing one engine stands on a node."""

    class State(TextChoices):
        INSTALLING = "installing"
        READY = "ready"
        FAILED = "failed"
        UNSUPPORTED = "unsupported"

    node = models.ForeignKey(Node, on_delete=models.CASCADE, related_name="engine_installs")
    engine = models.CharField(max_length=MAX_TEXT)
    version = models.CharField(max_length=MAX_TEXT, blank=True)
    variant = models.CharField(max_length=MAX_TEXT, blank=True)
    state = models.CharField(max_length=16, choices=State.choices)
    detail = models.TextField(blank=True)

    class Meta:
        ordering = ["engine"]

    def __str__(self) -> str:
        return f"{self.engine} {self.version} ({self.state})"


def actor_name(user) -> str:
    """How an event names who did it: the user, or the system itself."""
    if user is None:
        return "system"
    return user.get_username()
