"""Fabrics: a node's attachment to an operator-named interconnect.

Names come from the operator, not from GID prefixes: every subnet manager's
default prefix is the same, so a matching prefix proves nothing.
"""

from django.db import models

from agent.protocol import MAX_TEXT
from inventory.models.nodes import Node


class FabricAttachment(models.Model):
    """A node's adapters on one fabric, and the rate of its slowest active port."""

    node = models.ForeignKey(Node, on_delete=models.CASCADE, related_name="fabrics")
    fabric = models.CharField(max_length=MAX_TEXT, db_index=True)
    hcas = models.JSONField(default=list)
    # The slowest active port: a collective runs at the speed of its slowest link.
    rate_gbps = models.PositiveIntegerField(default=0)

    class Meta:
        ordering = ["node", "fabric"]
        constraints = [models.UniqueConstraint(fields=["node", "fabric"], name="unique_fabric_per_node")]

    def __str__(self) -> str:
        return f"{self.node_id}@{self.fabric}"
