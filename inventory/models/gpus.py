"""GPUs: the accelerators a node reports, their health, and the class placement asks for.

A GPU has two verdicts. `health` is its agent's: "ok", or why the agent says
it must not be used (a foreign process on it). `condition` is the control
plane's, moved by the error evidence the agent samples (inventory.gpuhealth,
docs/gpus.md): healthy, degraded or failed. Only a GPU both agree on is free.
"""

from __future__ import annotations

import re

from django.db import models
from django.db.models import Exists, OuterRef, Q

from inventory.models.allocations import GPUClaim
from inventory.models.choices import ValueChoices
from inventory.models.nodes import Node

_VENDOR_WORDS = re.compile(r"\b(NVIDIA|Tesla|GeForce|Quadro|AMD|Instinct|Radeon)\b", re.IGNORECASE)
_MODEL = re.compile(r"\b(RTX\s?\d{4}[A-Z]{0,2}|[A-Z]{1,3}\d{1,4}[A-Z]{0,2})\b", re.IGNORECASE)
_MEMORY_IN_NAME = re.compile(r"(\d{1,3})\s?GB\b", re.IGNORECASE)

HEALTH_OK = "ok"


class GPUCondition(ValueChoices):
    """The control plane's verdict on a GPU (inventory.gpuhealth moves it; docs/gpus.md has the rules)."""

    HEALTHY = "healthy"
    # Takes no new shard; what runs on it stays. Back to healthy after enough clean samples.
    DEGRADED = "degraded"
    # Takes nothing; the replica holding it is rebuilt elsewhere. Only an operator clears it.
    FAILED = "failed"


# One colour per condition, as STATE_COLOURS for nodes.
CONDITION_COLOURS = {
    GPUCondition.HEALTHY: "green",
    GPUCondition.DEGRADED: "amber",
    GPUCondition.FAILED: "red",
}


def free_q() -> Q:
    """A GPU is free when its agent and the control plane both call it healthy and no shard's allocation claims it.

    The one definition, as a filter, for querysets and for `Count(..., filter=)`
    in aggregates. Whether its node may take new shards is a separate question
    (`Node.objects.schedulable()`): the pages and /metrics count a cordoned
    node's free GPUs, placement uses only those of ready nodes.
    """
    claimed = GPUClaim.objects.filter(node_id=OuterRef("node_id"), gpu_index=OuterRef("index"))
    return Q(health=HEALTH_OK, condition=GPUCondition.HEALTHY) & ~Exists(claimed)


class GPUQuerySet(models.QuerySet):
    def free(self) -> GPUQuerySet:
        return self.filter(free_q())

    def with_free(self) -> GPUQuerySet:
        """Every GPU, each with `is_free` (free_q as a column): one pass reads all GPUs and which are free."""
        return self.annotate(is_free=models.ExpressionWrapper(free_q(), output_field=models.BooleanField()))


def gpu_class(name: str, memory_bytes: int = 0) -> str:
    """A short class such as `H100-80GB`, from the product name and memory.

    Placement matches on this, so two cards that differ only in packaging
    (SXM or PCIe, HBM2e or HBM3) share a class, while the 40 and 80 GB A100s
    do not: a model that fits one does not fit the other.
    """
    stripped = _VENDOR_WORDS.sub(" ", name)
    match = _MODEL.search(stripped)
    model = match.group(1).replace(" ", "").upper() if match else " ".join(stripped.split()) or "unknown"
    memory = _MEMORY_IN_NAME.search(stripped)
    if memory:
        gigabytes = int(memory.group(1))
    elif memory_bytes:
        gigabytes = round(memory_bytes / 2**30)
    else:
        return model
    return f"{model}-{gigabytes}GB"


class GPU(models.Model):
    """One accelerator. `health` is its agent's verdict, `condition` the control plane's (module docstring)."""

    node = models.ForeignKey(Node, on_delete=models.CASCADE, related_name="gpus")
    index = models.PositiveSmallIntegerField()
    uuid = models.CharField(max_length=256, blank=True)
    name = models.CharField(max_length=256, blank=True)
    gpu_class = models.CharField("class", max_length=64, db_index=True)
    memory_bytes = models.BigIntegerField(default=0)
    ecc_errors = models.PositiveIntegerField(default=0)
    health = models.CharField(max_length=1024, default=HEALTH_OK)
    # The control plane's own fields: an inventory report never writes them
    # (registration keeps them while the GPU keeps its uuid).
    # Indexed: each reconcile pass looks for the few degraded and failed GPUs among all of them.
    condition = models.CharField(
        max_length=16, choices=GPUCondition.choices, default=GPUCondition.HEALTHY, db_index=True
    )
    condition_reason = models.CharField(max_length=1024, blank=True)
    condition_since = models.DateTimeField(null=True, blank=True)

    objects = GPUQuerySet.as_manager()

    class Meta:
        ordering = ["node", "index"]
        constraints = [models.UniqueConstraint(fields=["node", "index"], name="unique_gpu_index_per_node")]

    def __str__(self) -> str:
        # Ids only, never the reported name: the admin shows this text without bidi isolation.
        return f"{self.node_id}/gpu{self.index}"

    def save(self, *args, **kwargs):
        self.gpu_class = gpu_class(self.name, self.memory_bytes)
        super().save(*args, **kwargs)

    @property
    def agent_healthy(self) -> bool:
        """Whether its agent calls it fit for use (the control plane may not: `condition`)."""
        return self.health == HEALTH_OK

    @property
    def healthy(self) -> bool:
        """Free but for claims: as free_q, for one row in hand."""
        return self.health == HEALTH_OK and self.condition == GPUCondition.HEALTHY
