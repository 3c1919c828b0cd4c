"""Deployments: models the operator wants served, as replicas made of shards.

A deployment's profile says what one shard needs; placement finds nodes for
all the shards of a replica at once. Replica and shard rows keep a state and
the reason for its last change, so the admin can say why something is not
running.
"""

from __future__ import annotations

import secrets
import shlex

from django.core.exceptions import ValidationError
from django.core.validators import MaxValueValidator, MinValueValidator, RegexValidator
from django.db import models
from django.db.models.signals import post_save, pre_delete
from django.dispatch import receiver
from django.utils import timezone

from agent import enginekinds
from inventory.models.allocations import Allocation
from inventory.models.choices import ValueChoices
from inventory.models.gpus import GPU_CLASS_LENGTH
from inventory.models.nodes import Node
from livestate import shardversion

# Replica and shard ids are built from the name and travel in heartbeats as
# node-id-like strings, so the name keeps to the same alphabet.
NAME_VALIDATOR = RegexValidator(
    # \Z, not $: RegexValidator searches, and $ also matches before a final newline.
    r"^[a-z0-9][a-z0-9._-]*\Z",
    "lower-case letters, digits, '.', '_' and '-', starting with a letter or digit",
)


# What clients send as `model` through the gateway. It becomes an HAProxy map key and backend
# name, so it keeps to their alphabet (no spaces, no '/': never a file path).
SERVED_MODEL_VALIDATOR = RegexValidator(
    r"^[A-Za-z0-9][A-Za-z0-9._:-]*\Z",
    "letters, digits, '.', '_', ':' and '-', starting with a letter or digit (not a path)",
)


def new_engine_secret() -> str:
    """256 random bits, URL-safe, never starting with "-": an engine that reads its key back as a
    command-line word (SGLang's --config file) would take such a key for a flag."""
    while (secret := secrets.token_urlsafe(32)).startswith("-"):
        pass
    return secret


# The engine kinds the control plane may place, from their records (agent/enginekinds/): Engine.VLLM, Engine.DEMO...
Engine = models.TextChoices(
    "Engine", [(kind.choice_key, (kind.name, kind.label)) for kind in enginekinds.KINDS if kind.placeable]
)


class ReplicaState(ValueChoices):
    """Where a replica or a shard stands. A replica lives and fails whole."""

    PENDING = "pending"
    PLACED = "placed"
    STARTING = "starting"
    RUNNING = "running"
    FAILED = "failed"
    RELEASING = "releasing"


# States in which a replica holds, or is waiting for, a place in the fleet.
LIVE_STATES = (ReplicaState.PENDING, ReplicaState.PLACED, ReplicaState.STARTING, ReplicaState.RUNNING)
# States in which a shard is on a node and its agent should run it.
RUN_STATES = (ReplicaState.PLACED, ReplicaState.STARTING, ReplicaState.RUNNING)

REPLICA_COLOURS = {
    ReplicaState.PENDING: "amber",
    ReplicaState.PLACED: "blue",
    ReplicaState.STARTING: "blue",
    ReplicaState.RUNNING: "green",
    ReplicaState.FAILED: "red",
    ReplicaState.RELEASING: "orange",
}


# Shown in place of secret arguments, so that the reader knows something is there.
SECRET_ARGUMENTS = "(secret: shown only to those who may change this deployment)"


class Deployment(models.Model):
    """A model to serve: where its weights are, which engine, how many replicas, and the profile."""

    name = models.CharField(max_length=64, unique=True, validators=[NAME_VALIDATOR])
    served_model_name = models.CharField(
        "served model name",
        max_length=128,
        unique=True,
        blank=True,
        validators=[SERVED_MODEL_VALIDATOR],
        help_text="What clients send as `model` through the gateway; empty takes the deployment's name.",
    )
    prefix_affinity = models.BooleanField(
        "prefix affinity",
        default=False,
        help_text="Send requests that start alike to the same replica, within a bound on its load, "
        "so an engine that caches prompts reuses them (docs/gateway.md).",
    )
    max_in_flight_per_replica = models.PositiveIntegerField(
        "max in flight per replica",
        null=True,
        blank=True,
        validators=[MinValueValidator(1), MaxValueValidator(100_000)],
        help_text="Requests each gateway sends one replica at once (its slots, say); beyond it the gateway queues "
        "them and serves tenants under their fair share first (docs/gateway.md). Empty: no limit.",
    )
    model_source = models.CharField(
        max_length=1024,
        help_text="A path on the nodes (starting with /), or an id the engine resolves itself.",
    )
    engine = models.CharField(max_length=16, choices=Engine.choices, default=Engine.VLLM)
    arguments = models.TextField(
        blank=True,
        help_text="Extra engine arguments, split like a shell would. For 'command', the whole command line; "
        "{port} and {model} are replaced.",
    )
    secret_arguments = models.BooleanField(
        "arguments are secret",
        default=False,
        help_text="They hold a secret (an API key): the arguments, and the engine environment made of them, are "
        "shown only to those who may change this deployment.",
    )
    replicas = models.PositiveIntegerField("replicas wanted", default=1, validators=[MaxValueValidator(10_000)])

    # The profile: what one shard needs.
    shards_per_replica = models.PositiveSmallIntegerField(
        default=1, validators=[MinValueValidator(1), MaxValueValidator(64)]
    )
    gpus_per_shard = models.PositiveSmallIntegerField(
        default=1, validators=[MaxValueValidator(64)], help_text="0 for engines that run on CPUs."
    )
    gpu_class = models.CharField(
        "GPU class", max_length=GPU_CLASS_LENGTH, blank=True, help_text="For example H100-80GB; empty takes any class."
    )
    memory_gb_per_shard = models.PositiveIntegerField(
        "host memory per shard (GB)", default=0, help_text="0 = undeclared: constrains nothing."
    )
    cpu_cores_per_shard = models.PositiveSmallIntegerField(
        "CPU cores per shard", default=0, help_text="0 = undeclared: constrains nothing."
    )

    # The engines of this deployment are started with it as their API key, and the gateway sends it
    # as their Authorization: an engine answers the gateways, not whoever reaches its port.
    engine_secret = models.CharField(max_length=64, default=new_engine_secret, editable=False)

    # Replica ordinals are never reused, so an agent can never confuse a
    # rebuilt replica's shard with the dead one it replaces.
    next_ordinal = models.PositiveIntegerField(default=1, editable=False)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name

    def save(self, *args, **kwargs):
        if not self.served_model_name:
            self.served_model_name = self.name
        # The ordinal counter belongs to the reconciler: an admin form or any
        # other instance loaded earlier must not wind it back on save.
        if self.pk and not self._state.adding and kwargs.get("update_fields") is None:
            kwargs["update_fields"] = [
                f.name for f in self._meta.concrete_fields if not f.primary_key and f.name != "next_ordinal"
            ]
        super().save(*args, **kwargs)

    def clean(self) -> None:
        if not self.served_model_name and self.name:
            # Filled in before the unique check runs, so a clash with another deployment's name is named here.
            self.served_model_name = self.name
        try:
            words = self.argv()
        except ValueError as exc:
            raise ValidationError({"arguments": f"cannot split: {exc}"}) from None
        kind = enginekinds.BY_NAME.get(self.engine)
        if kind is not None and kind.free_form and not words:
            raise ValidationError({"arguments": f"the '{kind.name}' engine needs a command line"})
        if self.gpus_per_shard == 0 and self.gpu_class:
            raise ValidationError({"gpu_class": "a GPU class needs at least one GPU per shard"})

    def argv(self) -> list[str]:
        return shlex.split(self.arguments)

    def hides_arguments_from(self, may_change: bool) -> bool:
        """The one rule for every view (API, admin): secret arguments only for one who may change them."""
        return self.secret_arguments and not may_change

    def arguments_for(self, may_change: bool) -> str:
        return SECRET_ARGUMENTS if self.hides_arguments_from(may_change) else self.arguments

    @property
    def model_is_path(self) -> bool:
        return self.model_source.startswith("/")


class Replica(models.Model):
    """One complete copy of a deployment's model: its shards run together or not at all."""

    deployment = models.ForeignKey(Deployment, on_delete=models.CASCADE, related_name="replica_set")
    replica_id = models.CharField(max_length=128, unique=True)
    ordinal = models.PositiveIntegerField()
    state = models.CharField(max_length=16, choices=ReplicaState.choices, default=ReplicaState.PENDING)
    reason = models.TextField(blank=True)
    changed_at = models.DateTimeField(default=timezone.now)
    # The fabric joining a multi-node replica's nodes; empty on one node.
    fabric = models.CharField(max_length=256, blank=True)
    # Set on a replacement built to move this replica off a draining node.
    replaces = models.ForeignKey("self", null=True, blank=True, on_delete=models.SET_NULL, related_name="replacements")
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["deployment", "ordinal"]
        indexes = [models.Index(fields=["state"])]

    def __str__(self) -> str:
        return self.replica_id


class Shard(models.Model):
    """One engine process group of a replica, on one node once placed."""

    replica = models.ForeignKey(Replica, on_delete=models.CASCADE, related_name="shards")
    shard_id = models.CharField(max_length=128, unique=True)
    index = models.PositiveSmallIntegerField()
    node = models.ForeignKey(Node, null=True, blank=True, on_delete=models.SET_NULL, related_name="shards")
    state = models.CharField(max_length=16, choices=ReplicaState.choices, default=ReplicaState.PENDING)
    reason = models.TextField(blank=True)
    changed_at = models.DateTimeField(default=timezone.now)
    gpu_indices = models.JSONField(default=list, blank=True)
    # Only the adapters of the replica's fabric: a shard given another
    # fabric's adapter may pick a peer it cannot reach, and hang.
    hcas = models.JSONField(default=list, blank=True)
    port = models.PositiveIntegerField(default=0)
    # As the agent reports it; the engine's own /metrics for Prometheus.
    metrics_port = models.PositiveIntegerField(default=0)

    class Meta:
        ordering = ["replica", "index"]
        constraints = [models.UniqueConstraint(fields=["replica", "index"], name="unique_shard_index")]
        indexes = [models.Index(fields=["node", "state"])]

    def __str__(self) -> str:
        return self.shard_id


@receiver(pre_delete, sender=Replica)
def _free_deleted_replica(sender, instance: Replica, **kwargs) -> None:
    """A replica deleted by hand, or with its deployment, frees its GPUs and memory at once.

    Its agents stop its shards on their next beat. Scaling down instead lets
    the engines stop before their GPUs are handed out again.
    """
    Allocation.objects.filter(replica_id=instance.replica_id).delete()
    shardversion.bump(instance.shards.values_list("node_id", flat=True))


@receiver(post_save, sender=Deployment)
def _deployment_changed(sender, instance: Deployment, **kwargs) -> None:
    """New arguments or engine change the commands agents are given, on any node."""
    shardversion.bump()
