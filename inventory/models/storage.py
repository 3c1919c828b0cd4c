"""Storage: filesystems that hold model directories, and the weights on them."""

from django.db import models

from agent.protocol import MAX_DETAIL, MAX_TEXT
from inventory.models.nodes import Node


class Filesystem(models.Model):
    """One filesystem holding model directories, as the agent last saw it.

    `shared` marks network and cluster filesystems: their space belongs to
    every node that mounts them, so it is never counted as a node's own disk.
    """

    node = models.ForeignKey(Node, on_delete=models.CASCADE, related_name="filesystems")
    mount = models.CharField(max_length=MAX_DETAIL)
    fstype = models.CharField(max_length=MAX_TEXT, blank=True)
    total_bytes = models.BigIntegerField(default=0)
    free_bytes = models.BigIntegerField(default=0)
    shared = models.BooleanField(default=False)

    class Meta:
        ordering = ["node", "mount"]

    def __str__(self) -> str:
        return f"{self.node_id}:{self.mount}"


class Weights(models.Model):
    """Model files a node can see: a model directory or a GGUF file."""

    node = models.ForeignKey(Node, on_delete=models.CASCADE, related_name="weights")
    path = models.CharField(max_length=MAX_DETAIL)
    size_bytes = models.BigIntegerField(default=0)
    format = models.CharField(max_length=16, blank=True)

    class Meta:
        ordering = ["node", "path"]
        verbose_name_plural = "weights"
        indexes = [models.Index(fields=["path"])]

    def __str__(self) -> str:
        return f"{self.node_id}:{self.path}"
