"""The fleet collector: built on each scrape from the inventory, fresh loads and own counters.

Each scrape runs the four inventory queries and one Redis round trip (every
node's load with one MGET, the self-metrics hash with HGETALL, pipelined), so
its cost in queries does not grow with the fleet. A node gone from the
inventory has no series: nothing is carried over from one scrape to the next.
A load older than LLMGW_LOAD_MAX_AGE, on the control plane's clock, is left
out rather than repeated; the node's inventory series stay.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator

import redis
from django.conf import settings
from prometheus_client import Metric
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.utils import floatToGoString

from inventory.models import derive_state
from nodes import loadstore, selfmetrics
from nodes.metrics import families, inventory
from nodes.metrics.exposition import RenderedFamily
from nodes.metrics.families import Family
from nodes.metrics.lines import labelset, line

log = logging.getLogger(__name__)


class FleetCollector:
    """A prometheus_client collector; `describe()` runs no query, so registering it is free."""

    def describe(self) -> list[Metric]:
        return [Metric(family.name, family.documentation, family.type) for family in families.ALL]

    def collect(self) -> Iterator[Metric]:
        scrape = Scrape.take(time.time())
        yield GaugeMetricFamily(
            families.LOADSTORE_UP.name, families.LOADSTORE_UP.documentation, value=int(scrape.redis_ok)
        )
        yield from scrape.fleet()
        yield from self_families(scrape.counters)


def rendered(family: Family, chunks) -> RenderedFamily:
    return RenderedFamily(family.name, family.documentation, family.type, chunks)


class Scrape:
    """One scrape's data, read eagerly; its families are rendered lazily, one at a time."""

    def __init__(self, now: float, inv: inventory.Inventory, raw_loads: list, counters: dict, redis_ok: bool):
        self.now = now
        self.inventory = inv
        self.counters = counters
        self.redis_ok = redis_ok
        self.node_label = {row[0]: labelset(node=row[0]) for row in inv.nodes}
        oldest = now - settings.LLMGW_LOAD_MAX_AGE
        self.loads = {}
        for node_id, raw in zip(self.node_label, raw_loads, strict=False):
            stored = loadstore.decode_for_scrape(raw)
            if stored is not None and stored.received_at >= oldest and len(stored.lines) == len(families.NODE_LOAD):
                self.loads[node_id] = stored
        # Allocations on nodes still in the inventory, with their labels written once.
        self.shards = {
            shard: (node, labelset(model=model, node=node, replica=replica, shard=shard), memory_gb, gpus)
            for node, shard, replica, model, memory_gb, gpus in inv.allocations
            if node in self.node_label
        }

    @classmethod
    def take(cls, now: float) -> Scrape:
        inv = inventory.read()
        node_ids = [row[0] for row in inv.nodes]
        try:
            pipe = loadstore.client().pipeline(transaction=False)
            if node_ids:
                pipe.mget([loadstore.key(node_id) for node_id in node_ids])
            pipe.hgetall(selfmetrics.HASH)
            replies = pipe.execute()
        except redis.RedisError as exc:
            # The inventory is still worth exporting; llmgw_loadstore_up says what is missing.
            log.warning("/metrics without loads: %s", exc)
            return cls(now, inv, [], {}, redis_ok=False)
        raw_loads = replies[0] if node_ids else []
        return cls(now, inv, raw_loads, selfmetrics.read(replies[-1]), redis_ok=True)

    def fleet(self) -> Iterator[RenderedFamily]:
        for index, family in enumerate(families.NODE_LOAD):
            yield rendered(family, (stored.lines[index] for stored in self.loads.values()))
        yield rendered(families.SHARD_CPU, self._shard_lines(families.SHARD_CPU.name, "cpu_cores"))
        yield rendered(families.SHARD_MEMORY, self._shard_lines(families.SHARD_MEMORY.name, "rss_bytes"))
        yield from self._inventory()

    def _shard_lines(self, name: str, field: str) -> Iterator[str]:
        for node_id, stored in self.loads.items():
            for shard in stored.load.shards:
                placed = self.shards.get(shard.shard)
                if placed is not None and placed[0] == node_id:
                    labels = placed[1]
                else:
                    # Running but not (or no longer) allocated here: still measured, not yet labelled.
                    labels = labelset(model="", node=node_id, replica="", shard=shard.shard)
                yield line(name, labels, getattr(shard, field))

    def _inventory(self) -> Iterator[RenderedFamily]:
        nodes, node_label = self.inventory.nodes, self.node_label
        yield rendered(
            families.MEMORY_TOTAL,
            (line(families.MEMORY_TOTAL.name, node_label[n[0]], n[2]) for n in nodes if n[2] is not None),
        )
        yield rendered(
            families.STATE,
            (line(families.STATE.name, labelset(node=n[0], state=derive_state(n[9], n[10]).value), 1) for n in nodes),
        )
        yield rendered(families.INFO, (_info_line(n) for n in nodes))
        yield rendered(
            families.LAST_HEARTBEAT,
            (line(families.LAST_HEARTBEAT.name, node_label[n[0]], n[11].timestamp()) for n in nodes if n[11]),
        )
        gpus = [
            (labelset(**{"class": cls, "node": node}), count, free, memory)
            for node, cls, count, free, memory in self.inventory.gpus
            if node in node_label
        ]
        yield rendered(families.GPUS, (line(families.GPUS.name, labels, count) for labels, count, _, _ in gpus))
        yield rendered(families.GPUS_FREE, (line(families.GPUS_FREE.name, labels, free) for labels, _, free, _ in gpus))
        yield rendered(
            families.GPU_MEMORY, (line(families.GPU_MEMORY.name, labels, memory) for labels, _, _, memory in gpus)
        )
        disks = [(node_label[node], free, size) for node, free, size in self.inventory.disks if node in node_label]
        yield rendered(families.DISK_FREE, (line(families.DISK_FREE.name, labels, free) for labels, free, _ in disks))
        yield rendered(families.DISK_SIZE, (line(families.DISK_SIZE.name, labels, size) for labels, _, size in disks))
        shards = self.shards.values()
        yield rendered(families.SHARD_GPUS, (line(families.SHARD_GPUS.name, s[1], s[3]) for s in shards))
        yield rendered(
            families.SHARD_MEMORY_CLAIM, (line(families.SHARD_MEMORY_CLAIM.name, s[1], s[2] * 2**30) for s in shards)
        )


def _info_line(node: tuple) -> str:
    node_id, hostname, _, os, os_version, kernel, arch, cpu_model, agent_version = node[:9]
    labels = labelset(
        agent_version=agent_version,
        arch=arch,
        cpu_model=cpu_model,
        hostname=hostname,
        kernel=kernel,
        node=node_id,
        os=os,
        os_version=os_version,
    )
    return line(families.INFO.sample, labels, 1)


def self_families(counters: dict[str, float]) -> Iterator[Metric]:
    """The control plane's own counters, as prometheus_client families (a few dozen samples)."""
    yield CounterMetricFamily(
        families.HEARTBEATS_ACCEPTED.name,
        families.HEARTBEATS_ACCEPTED.documentation,
        value=counters.get("heartbeats:accepted", 0),
    )
    rejected = CounterMetricFamily(
        families.HEARTBEATS_REJECTED.name, families.HEARTBEATS_REJECTED.documentation, labels=["reason"]
    )
    for field, value in sorted(counters.items()):
        reason = field.removeprefix("heartbeats:")
        if reason != field and reason != "accepted":
            rejected.add_metric([reason], value)
    yield rejected
    buckets, cumulative = [], 0.0
    for bound in (*selfmetrics.HEARTBEAT_BUCKETS, float("inf")):
        cumulative += counters.get(selfmetrics.bucket_field(bound), 0)
        buckets.append((floatToGoString(bound), cumulative))
    yield HistogramMetricFamily(
        families.HEARTBEAT_SECONDS.name,
        families.HEARTBEAT_SECONDS.documentation,
        buckets=buckets,
        sum_value=counters.get("heartbeat_seconds:sum", 0.0),
    )
    yield CounterMetricFamily(
        families.STALE_SWEEPS.name, families.STALE_SWEEPS.documentation, value=counters.get("sweeps", 0)
    )
    marked = CounterMetricFamily(families.NODES_MARKED.name, families.NODES_MARKED.documentation, labels=["liveness"])
    for liveness in ("unreachable", "lost"):
        marked.add_metric([liveness], counters.get(f"swept:{liveness}", 0))
    yield marked
    yield CounterMetricFamily(
        families.STALE_FAILURES.name, families.STALE_FAILURES.documentation, value=counters.get("swept:failed", 0)
    )
