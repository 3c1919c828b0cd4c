"""Allocations: which shard holds which GPUs and how much host memory on a node."""

from django.db import models

from inventory.models.nodes import Node


class Allocation(models.Model):
    """One shard placed on one node.

    `memory_gb` is the host memory the shard's profile claimed, counted so two
    models each declaring most of a machine are not both placed on it. Zero
    means the profile declared nothing, which constrains nothing.
    """

    node = models.ForeignKey(Node, on_delete=models.CASCADE, related_name="allocations")
    shard_id = models.CharField(max_length=128, unique=True)
    replica_id = models.CharField(max_length=128, db_index=True)
    # The model the shard serves, kept here so that exports and pages can label
    # a shard's figures without joining through deployments.
    model = models.CharField(max_length=1024, blank=True)
    memory_gb = models.PositiveIntegerField(default=0)
    # Cores claimed the same way as memory; zero constrains nothing.
    cpu_cores = models.PositiveIntegerField(default=0)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["node", "shard_id"]

    def __str__(self) -> str:
        return f"{self.shard_id} on {self.node_id}"

    @property
    def gpu_indices(self) -> list[int]:
        return sorted(claim.gpu_index for claim in self.gpu_claims.all())


class GPUClaim(models.Model):
    """One GPU held by one allocation.

    A row per GPU, rather than a list on the allocation, so that the database
    itself refuses a GPU in two allocations on the same node.
    """

    allocation = models.ForeignKey(Allocation, on_delete=models.CASCADE, related_name="gpu_claims")
    node = models.ForeignKey(Node, on_delete=models.CASCADE, related_name="gpu_claims")
    gpu_index = models.PositiveSmallIntegerField()

    class Meta:
        constraints = [models.UniqueConstraint(fields=["node", "gpu_index"], name="gpu_in_one_allocation")]

    def __str__(self) -> str:
        return f"{self.node_id}/gpu{self.gpu_index} → {self.allocation.shard_id}"
