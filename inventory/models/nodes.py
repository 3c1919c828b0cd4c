"""Nodes: one machine each, its host facts, and the record of its state changes."""

from __future__ import annotations

from django.db import models
from django.utils import timezone

from inventory.models.choices import AdminState, Liveness, NodeState, derive_state


class Node(models.Model):
    """A machine in the fleet.

    Everything but `labels`, `notes` and the admin-state fields is owned by the
    node's agent and replaced whenever it reports a new inventory.
    """

    id = models.CharField(primary_key=True, max_length=128)
    hostname = models.CharField(max_length=256, blank=True)
    mgmt_addr = models.CharField("management address", max_length=256, blank=True)
    # Labels from the agent's config; replaced on every inventory report.
    labels = models.JSONField(default=dict, blank=True)
    # Labels set by operators in the admin; they win over the agent's on a clash.
    operator_labels = models.JSONField(default=dict, blank=True)
    notes = models.TextField(blank=True)
    # Null: the agent has not said. Treated as no constraint, never as zero.
    memory_total_bytes = models.BigIntegerField(null=True, blank=True)

    os = models.CharField(max_length=256, blank=True)
    os_version = models.CharField(max_length=256, blank=True)
    kernel = models.CharField(max_length=256, blank=True)
    arch = models.CharField(max_length=64, blank=True)
    cpu_model = models.CharField(max_length=256, blank=True)
    cpus = models.PositiveIntegerField(default=0)

    agent_version = models.CharField(max_length=256, blank=True)
    engine_versions = models.JSONField(default=dict, blank=True)
    # Says engine_versions is an answer: an empty map then means "has none".
    engines_probed = models.BooleanField(default=False)
    # Says the weights are an answer: the agent had model directories to look in.
    weights_scanned = models.BooleanField(default=False)
    inventory_hash = models.CharField(max_length=256, blank=True)
    # The client address the node's latest registration or inventory came from: what the
    # control plane itself saw, unlike mgmt_addr, which the agent claims (nodes/targets.py).
    source_addr = models.GenericIPAddressField("source address", null=True, blank=True)
    # Which heartbeat the stored inventory came from: the agent run's boot id and its
    # number in that run ("" and 0: said nothing), so an older one is refused.
    inventory_boot_id = models.CharField(max_length=128, blank=True)
    inventory_seq = models.PositiveBigIntegerField(default=0)

    admin_state = models.CharField(max_length=16, choices=AdminState.choices, default=AdminState.ACTIVE)
    admin_state_by = models.CharField("changed by", max_length=150, blank=True)
    admin_state_at = models.DateTimeField("changed at", null=True, blank=True)
    admin_state_reason = models.TextField("reason", blank=True)

    liveness = models.CharField(max_length=16, choices=Liveness.choices, default=Liveness.ALIVE)
    # On the control plane's clock, never the agent's.
    last_heartbeat = models.DateTimeField(null=True, blank=True, db_index=True)
    registered_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["id"]
        indexes = [models.Index(fields=["liveness", "last_heartbeat"])]

    def __str__(self) -> str:
        return self.id

    def get_absolute_url(self) -> str:
        return f"/nodes/{self.id}/"

    @property
    def state(self) -> NodeState:
        return derive_state(self.admin_state, self.liveness)

    @property
    def all_labels(self) -> dict[str, str]:
        return {**self.labels, **self.operator_labels}

    @property
    def schedulable(self) -> bool:
        return self.liveness == Liveness.ALIVE and self.admin_state == AdminState.ACTIVE

    # Questions placement and the pages ask of one node. Each reads the
    # related managers, so a caller that prefetched them asks nothing more.

    def free_gpus(self) -> list[int]:
        """Indices of GPUs that are healthy and held by no allocation, sorted."""
        taken = {claim.gpu_index for claim in self.gpu_claims.all()}
        return sorted(gpu.index for gpu in self.gpus.all() if gpu.healthy and gpu.index not in taken)

    def gpus_by_class(self) -> dict[str, list]:
        grouped: dict[str, list] = {}
        for gpu in self.gpus.all():
            grouped.setdefault(gpu.gpu_class, []).append(gpu)
        return grouped

    @property
    def memory_total_gb(self) -> float | None:
        if not self.memory_total_bytes:
            return None
        return self.memory_total_bytes / 2**30

    def claimed_memory_gb(self) -> int:
        return sum(allocation.memory_gb for allocation in self.allocations.all())

    def free_memory_gb(self) -> float | None:
        """Host memory not yet claimed by placed shards; None when the total is unknown.

        None means unconstrained, not zero: a node whose agent never reported
        its memory is placed on as freely as before the field existed.
        """
        total = self.memory_total_gb
        if total is None:
            return None
        return max(total - self.claimed_memory_gb(), 0.0)

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

    def knows_its_weights(self) -> bool:
        """Whether the node looked for weights at all (it had model directories)."""
        return self.weights_scanned

    def has_weights(self, path: str) -> bool:
        """Exact path match: a source that is not a path cannot be checked from here."""
        return any(weights.path == path for weights in self.weights.all())

    def fabric_names(self) -> list[str]:
        return sorted(attachment.fabric for attachment in self.fabrics.all())

    def adapters_for(self, fabric: str) -> list[str]:
        """The adapters on one fabric only.

        A shard handed adapters of a second fabric may pick one whose peer is
        unreachable, and the job hangs instead of failing.
        """
        for attachment in self.fabrics.all():
            if attachment.fabric == fabric:
                return list(attachment.hcas)
        return []


class NodeEvent(models.Model):
    """One change of a node's liveness or admin state, or a registration."""

    class Kind(models.TextChoices):
        LIVENESS = "liveness"
        ADMIN = "admin"
        REGISTRATION = "registration"

    node = models.ForeignKey(Node, on_delete=models.CASCADE, related_name="events")
    at = models.DateTimeField(default=timezone.now, db_index=True)
    kind = models.CharField(max_length=16, choices=Kind.choices)
    from_state = models.CharField(max_length=16, blank=True)
    to_state = models.CharField(max_length=16, blank=True)
    reason = models.TextField(blank=True)
    actor = models.CharField(max_length=150, blank=True)

    class Meta:
        ordering = ["-at", "-id"]

    def __str__(self) -> str:
        return f"{self.node_id}: {self.from_state} → {self.to_state}"


class EngineInstall(models.Model):
    """Where installing one engine stands on a node."""

    class State(models.TextChoices):
        INSTALLING = "installing"
        READY = "ready"
        FAILED = "failed"
        UNSUPPORTED = "unsupported"

    node = models.ForeignKey(Node, on_delete=models.CASCADE, related_name="engine_installs")
    engine = models.CharField(max_length=256)
    version = models.CharField(max_length=256, blank=True)
    variant = models.CharField(max_length=256, blank=True)
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
