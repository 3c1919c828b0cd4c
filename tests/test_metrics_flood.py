"""One node cannot flood Prometheus (issue 22): its load's series are only for what the inventory and placement hold.

A 31 KB heartbeat naming 64 invented shards and 64 GPUs at index 0, each with
its own uuid, added some 384 series to every scrape, and new ones whenever the
names changed. The heartbeats go through the real agent API here, and /metrics
is read back as Prometheus would, rendered on request and rendered ahead.
"""

from __future__ import annotations

import time
import zlib

import pytest

from agent import protocol
from inventory.models import Allocation
from inventory.reconcile import reconcile
from nodes.metrics import prerender
from tests.agentapi import JOIN_TOKEN, a_load, heartbeat, register, reply_of
from tests.factories import deployment
from tests.metrics_scrape import TEXT, body, named, samples

pytestmark = [pytest.mark.django_db]

GPU_FAMILIES = (
    "llmgw_gpu_utilization_percent",
    "llmgw_gpu_memory_used_bytes",
    "llmgw_gpu_temperature_celsius",
    "llmgw_gpu_power_watts",
)
SHARD_FAMILIES = ("llmgw_shard_cpu_cores", "llmgw_shard_memory_bytes")


@pytest.fixture(autouse=True)
def _join_token(settings, redis_client):
    settings.LLMGW_JOIN_TOKEN = JOIN_TOKEN


@pytest.fixture
def token(client):
    """gpu-1 with two GPUs, GPU-gpu-1.example-0 and -1 (tests.factories.make_inventory), one of them placed."""
    token = register(client, "gpu-1", gpus=2)
    deployment(gpus_per_shard=1)
    reconcile()
    return token


def gpu(index: int, uuid: str) -> protocol.GPULoad:
    return protocol.GPULoad(index=index, uuid=uuid, utilization_percent=50, memory_used_bytes=1, temperature_celsius=40)


def beat(client, token: str, gpus: list[protocol.GPULoad], shards: list[str], seq: int) -> None:
    load = a_load()
    load.gpus = gpus
    load.shards = [protocol.ShardLoad(shard=shard, cpu_cores=1.0, rss_bytes=2**30) for shard in shards]
    reply_of(heartbeat(client, token, protocol.Heartbeat(inventory_hash="hash-1", load=load, boot_id="b", seq=seq)))


def load_series(client) -> set[tuple[str, frozenset]]:
    found = samples(body(client.get("/metrics", HTTP_ACCEPT=TEXT)))
    return {(name, labels) for name in (*GPU_FAMILIES, *SHARD_FAMILIES) for labels in named(found, name)}


def test_invented_shards_and_gpus_add_no_series(client, token):
    placed = Allocation.objects.get(node_id="gpu-1").shard_id
    honest = [gpu(0, "GPU-gpu-1.example-0"), gpu(1, "GPU-gpu-1.example-1")]
    beat(client, token, honest, [placed], seq=1)
    expected = load_series(client)
    assert len(expected) == 2 * 3 + 2, "three figures of each GPU, two of the placed shard"

    flood = [gpu(0, f"GPU-invented-{i}") for i in range(protocol.MAX_GPUS)]
    beat(client, token, flood, [f"invented-{i}" for i in range(protocol.MAX_SHARDS)], seq=2)

    # GPU 0 by another uuid is not the inventory's GPU 0; nothing else was ever there.
    assert load_series(client) == set()

    beat(client, token, [*honest, *flood[:3], gpu(7, "GPU-gpu-1.example-1")], [placed, "invented-1"], seq=3)
    assert load_series(client) == {
        series for series in expected if dict(series[1]).get("gpu") == "1" or series[0] in SHARD_FAMILIES
    }, "GPU 0 is listed again after the honest one, and the last of an index is kept"


def test_the_known_gpus_and_the_placed_shard_are_exported_whole(client, token):
    placed = Allocation.objects.get(node_id="gpu-1").shard_id
    beat(client, token, [gpu(1, "GPU-gpu-1.example-1"), gpu(0, "GPU-gpu-1.example-0")], [placed, "stray"], seq=1)

    found = samples(body(client.get("/metrics", HTTP_ACCEPT=TEXT)))

    assert {dict(labels)["uuid"] for labels in named(found, "llmgw_gpu_utilization_percent")} == {
        "GPU-gpu-1.example-0",
        "GPU-gpu-1.example-1",
    }
    assert [dict(labels)["shard"] for labels in named(found, "llmgw_shard_cpu_cores")] == [placed]


def test_the_render_made_ahead_exports_no_more(client, token):
    beat(client, token, [gpu(0, f"GPU-invented-{i}") for i in range(8)], [f"invented-{i}" for i in range(8)], seq=1)

    _, packed = prerender.render(time.time())

    assert b"invented" not in zlib.decompress(packed, wbits=31)


def test_a_load_naming_some_or_none_of_the_held_gpus_is_exported_as_it_is(client, token):
    placed = Allocation.objects.get(node_id="gpu-1").shard_id
    beat(client, token, [gpu(1, "GPU-gpu-1.example-1")], [placed], seq=1)
    found = samples(body(client.get("/metrics", HTTP_ACCEPT=TEXT)))
    assert [dict(labels)["gpu"] for labels in named(found, "llmgw_gpu_utilization_percent")] == ["1"]

    beat(client, token, [], [placed], seq=2)
    found = samples(body(client.get("/metrics", HTTP_ACCEPT=TEXT)))
    assert named(found, "llmgw_gpu_utilization_percent") == {}
    assert [dict(labels)["node"] for labels in named(found, "llmgw_node_cpus")] == ["gpu-1"]
