"""Joining: a join token and a node's id and inventory buy the node a fresh token."""

from __future__ import annotations

from datetime import datetime

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from agent import protocol
from inventory import desired
from inventory.liveness import touch
from inventory.registration import as_ip, record_registration, upsert_inventory
from nodes.api import cards
from nodes.models import JoinToken, NodeToken, digest, digest_matches


def join_token_name(token: str) -> str | None:
    """Which join token this is ("cluster" for LLMGW_JOIN_TOKEN), or None if none is."""
    cluster_token = settings.LLMGW_JOIN_TOKEN or ""
    # Compare digests, so the comparison takes as long whatever the lengths.
    if cluster_token and digest_matches(token, digest(cluster_token)):
        return "cluster"
    join_token = JoinToken.find(token)
    if join_token is None:
        return None
    JoinToken.objects.filter(pk=join_token.pk).update(last_used_at=timezone.now())
    return join_token.name


def register_node(
    message: protocol.Register, joined_with: str, address: str = "", now: datetime | None = None
) -> protocol.Registered:
    """Record the node and its inventory, and issue it a new token, in one transaction.

    An existing node keeps its admin state and is brought back to alive (a
    registration is a sign of life); its old token stops working at once.
    `address`, the client address the registration came from, is recorded as
    the node's source address (nodes/targets.py). Once committed, the node's
    card and shard list are cached, so its first heartbeat reads no row: a fleet
    registering and then beating would otherwise read every node's shards from
    the database at its first beats (bench.recovery's `registered` case).
    """
    now = now or timezone.now()
    with transaction.atomic():
        node, created = upsert_inventory(
            message.node_id, message.inventory, message.inventory_hash, now=now, source_addr=as_ip(address)
        )
        token = NodeToken.issue(node, first=created)
        if not created:
            touch(node, now)
        record_registration(node, created, actor=f"agent (join token: {joined_with})"[:150])
    cards.cache_after_commit(node.pk)
    # After the commit, which an error here must not turn into a failed registration (robust).
    transaction.on_commit(lambda: desired.orders(node.pk), robust=True)
    return protocol.Registered(node_id=node.pk, token=token, heartbeat_interval=settings.LLMGW_HEARTBEAT_INTERVAL)
