"""Helpers for the agent API tests: register a node and post heartbeats as its agent would."""

from __future__ import annotations

import requests

from agent import protocol
from tests.factories import make_inventory

JOIN_TOKEN = "test-join-token-of-the-cluster"


def post(client, path: str, body: bytes | protocol.Struct, token: str | None, **headers):
    if isinstance(body, protocol.Struct):
        body = protocol.encode(body)
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    return client.post(path, data=body, content_type=headers.pop("content_type", "application/json"), headers=headers)


def register(client, node_id: str, join_token: str = JOIN_TOKEN, **inventory) -> str:
    """Register a node as its agent would; returns the node token."""
    message = protocol.Register(
        node_id=node_id, inventory=make_inventory(f"{node_id}.example", **inventory), inventory_hash="hash-1"
    )
    response = post(client, "/api/v1/register", message, join_token)
    assert response.status_code == 200, response.content
    registered = protocol.decode(response.content, protocol.Registered)
    assert registered.node_id == node_id
    return registered.token


def register_over_http(base: str, message: protocol.Register, join_token: str = JOIN_TOKEN) -> str:
    """Register a node through a running stack at `base` (its proxy), as its agent would; returns the node token."""
    answer = requests.post(
        f"{base}/api/v1/register",
        data=protocol.encode(message),
        headers={"Authorization": f"Bearer {join_token}", "Content-Type": "application/json"},
        timeout=10,
    )
    assert answer.status_code == 200, answer.text
    return protocol.decode(answer.content, protocol.Registered).token


def heartbeat(client, token: str, beat: protocol.Heartbeat | bytes):
    return post(client, "/api/v1/heartbeat", beat, token)


def reply_of(response) -> protocol.HeartbeatReply:
    assert response.status_code == 200, response.content
    return protocol.decode(response.content, protocol.HeartbeatReply)


def a_load(cpu_percent: float = 12.5) -> protocol.Load:
    return protocol.Load(
        cpu_percent=cpu_percent,
        cpus=192,
        load1=3.0,
        load5=2.5,
        load15=2.0,
        memory_used_bytes=100 * 2**30,
        memory_available_bytes=400 * 2**30,
        interval_seconds=5.0,
        shards=[protocol.ShardLoad(shard="shard-a", cpu_cores=1.5, rss_bytes=2**30)],
    )


def database_snapshot() -> tuple:
    """Everything a heartbeat could change in the database, to compare before and after."""
    from inventory.models import GPU, EngineInstall, FabricAttachment, Filesystem, Node, NodeEvent, Weights

    return (
        list(Node.objects.order_by("pk").values()),
        [list(model.objects.order_by("pk").values()) for model in (GPU, Filesystem, Weights, FabricAttachment)],
        list(EngineInstall.objects.order_by("pk").values()),
        list(NodeEvent.objects.order_by("pk").values()),
    )
