"""The fleet collector: built on each scrape from the inventory, fresh loads and own counters.

Each scrape runs the five inventory queries and one Redis round trip (every
node's rendered load with one MGET, the self-metrics hash with HGETALL,
pipelined), so its cost in queries does not grow with the fleet. A node gone
from the inventory has no series: nothing is carried over from one scrape to
the next but the text of unchanged rows (nodes.metrics.rowcache). A load older
than LLMGW_LOAD_MAX_AGE, on the control plane's clock, is left out rather than
repeated; the node's inventory series stay.
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

import livestate
from inventory.models import derive_state
from livestate import loadlines, loadstore, selfmetrics
from livestate.samples import labelset, line
from nodes.metrics import families, inventory
from nodes.metrics.exposition import RenderedFamily
from nodes.metrics.families import Family
from nodes.metrics.rowcache import RowCache

log = logging.getLogger(__name__)


class FleetCollector:
    """A prometheus_client collector; `describe()` runs no query, so registering it is free."""

    def __init__(self):
        self.nodes = RowCache(_render_node)
        self.gpus = RowCache(_render_gpus)
        self.disks = RowCache(_render_disk)
        self.allocations = RowCache(_Allocation)

    def describe(self) -> list[Metric]:
        return [Metric(family.name, family.documentation, family.type) for family in families.ALL]

    def collect(self) -> Iterator[Metric]:
        scrape = Scrape.take(time.time())
        yield GaugeMetricFamily(
            families.LOADSTORE_UP.name, families.LOADSTORE_UP.documentation, value=int(scrape.redis_ok)
        )
        yield from self.fleet(scrape)
        yield from self_families(scrape.counters)

    def fleet(self, scrape: Scrape) -> Iterator[RenderedFamily]:
        inv = scrape.inventory
        # The last heartbeat changes with every beat, so it is no part of a node row's key.
        nodes = self.nodes.refresh(row[:-1] for row in inv.nodes)
        present = {row[0] for row in inv.nodes}
        allocations = self.allocations.refresh(row for row in inv.allocations if row[0] in present)

        for index, family in enumerate(families.NODE_LOAD):
            yield rendered(family, [stored.chunks[index] for _, stored in scrape.loads])
        shards = _shard_samples(scrape.loads, {a.shard: a for a in allocations})
        for family, field in ((families.SHARD_CPU, 1), (families.SHARD_MEMORY, 2)):
            name = family.name.encode()
            yield rendered(family, [name + sample[0] + b" " + sample[field] + b"\n" for sample in shards])

        for index, family in enumerate((families.MEMORY_TOTAL, families.STATE, families.INFO)):
            yield rendered(family, [node[index] for node in nodes])
        heartbeat = families.LAST_HEARTBEAT.name
        yield rendered(
            families.LAST_HEARTBEAT,
            [
                f"{heartbeat}{node[3]} {floatToGoString(row[-1])}\n".encode()
                for node, row in zip(nodes, inv.nodes, strict=True)
                if row[-1] is not None
            ],
        )
        gpus = self.gpus.refresh(row for row in inv.gpus if row[0] in present)
        for index, family in enumerate((families.GPUS, families.GPUS_FREE, families.GPU_MEMORY)):
            yield rendered(family, [text[index] for text in gpus])
        disks = self.disks.refresh(row for row in inv.disks if row[0] in present)
        for index, family in enumerate((families.DISK_FREE, families.DISK_SIZE)):
            yield rendered(family, [text[index] for text in disks])
        for index, family in enumerate((families.SHARD_GPUS, families.SHARD_MEMORY_CLAIM)):
            yield rendered(family, [a.lines[index] for a in allocations])


def rendered(family: Family, chunks: list[bytes]) -> RenderedFamily:
    return RenderedFamily(family.name, family.documentation, family.type, chunks)


class Scrape:
    """One scrape's data, all read before anything is written."""

    def __init__(self, inv: inventory.Inventory, fresh: list, counters: dict, redis_ok: bool):
        self.inventory = inv
        self.loads = fresh
        self.counters = counters
        self.redis_ok = redis_ok

    @classmethod
    def take(cls, now: float) -> Scrape:
        inv = inventory.read()
        node_ids = [row[0] for row in inv.nodes]
        try:
            pipe = livestate.client().pipeline(transaction=False)
            if node_ids:
                loadstore.queue_read_lines(pipe, node_ids)
            selfmetrics.queue_read(pipe)
            replies = pipe.execute()
        except redis.RedisError as exc:
            # The inventory is still worth exporting; llmgw_loadstore_up says what is missing.
            log.warning("/metrics without loads: %s", exc)
            return cls(inv, [], {}, redis_ok=False)
        oldest = now - settings.LLMGW_LOAD_MAX_AGE
        fresh = []
        for node_id, raw in zip(node_ids, replies[0] if node_ids else [], strict=True):
            stored = loadlines.parse(raw)
            if stored is not None and stored.received_at >= oldest:
                fresh.append((node_id, stored))
        return cls(inv, fresh, selfmetrics.read(replies[-1]), redis_ok=True)


def _shard_samples(fresh: list, placed: dict) -> list[tuple[bytes, bytes, bytes]]:
    """(labels, cores, bytes) of every shard in a fresh load, labelled from its allocation."""
    samples = []
    for node_id, stored in fresh:
        for shard, cores, resident in stored.shards:
            allocation = placed.get(shard.decode())
            if allocation is not None and allocation.node == node_id:
                labels = allocation.labels
            else:
                # Running but not (or no longer) allocated here: still measured, not yet labelled.
                labels = labelset(model="", node=node_id, replica="", shard=shard.decode()).encode()
            samples.append((labels, cores, resident))
    return samples


def _render_node(row: tuple) -> tuple[bytes, bytes, bytes, str]:
    """(memory total, state, info) lines of one node row (NODE_FIELDS without the heartbeat), and its label."""
    node_id, hostname, memory, os, os_version, kernel, arch, cpu_model, agent_version, admin, liveness = row
    node = labelset(node=node_id)
    info = labelset(
        agent_version=agent_version,
        arch=arch,
        cpu_model=cpu_model,
        hostname=hostname,
        kernel=kernel,
        node=node_id,
        os=os,
        os_version=os_version,
    )
    state = labelset(node=node_id, state=derive_state(admin, liveness).value)
    return (
        line(families.MEMORY_TOTAL.name, node, memory).encode() if memory is not None else b"",
        line(families.STATE.name, state, 1).encode(),
        line(families.INFO.sample, info, 1).encode(),
        node,
    )


def _render_gpus(row: tuple) -> tuple[bytes, bytes, bytes]:
    node_id, gpu_class, count, free, memory = row
    labels = labelset(**{"class": gpu_class, "node": node_id})
    return (
        line(families.GPUS.name, labels, count).encode(),
        line(families.GPUS_FREE.name, labels, free).encode(),
        line(families.GPU_MEMORY.name, labels, memory or 0).encode(),
    )


def _render_disk(row: tuple) -> tuple[bytes, bytes]:
    node_id, free, size = row
    node = labelset(node=node_id)
    return line(families.DISK_FREE.name, node, free).encode(), line(families.DISK_SIZE.name, node, size).encode()


class _Allocation:
    __slots__ = ("labels", "lines", "node", "shard")

    def __init__(self, row: tuple):
        node, shard, replica, model, memory_gb, gpus = row
        self.node, self.shard = node, shard
        labels = labelset(model=model, node=node, replica=replica, shard=shard)
        self.labels = labels.encode()
        self.lines = (
            line(families.SHARD_GPUS.name, labels, gpus).encode(),
            line(families.SHARD_MEMORY_CLAIM.name, labels, memory_gb * 2**30).encode(),
        )


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
        if reason not in (field, "accepted"):
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
    yield CounterMetricFamily(
        families.STALE_HELD.name, families.STALE_HELD.documentation, value=counters.get("swept:held", 0)
    )
