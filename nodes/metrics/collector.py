"""The fleet collector: built on each scrape from the inventory, fresh loads and own counters.

Each scrape runs the six inventory queries and one Redis round trip (every
node's rendered load with one MGET, the self-metrics hash with HGETALL,
pipelined), so its cost in queries does not grow with the fleet. A node gone
from the inventory has no series: nothing is carried over from one scrape to
the next but the text of unchanged rows (web.metrics.rowcache). A load older
than LLMGW_LOAD_MAX_AGE, on the control plane's clock, is left out rather than
repeated; the node's inventory series stay.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from typing import NamedTuple

import redis
from prometheus_client import Metric
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.utils import floatToGoString

import livestate
from inventory.models import derive_state
from livestate import loadlines, loadstore, selfmetrics
from livestate.samples import labelset, line
from nodes.metrics import families, inventory_series, known
from nodes.metrics.exposition import RenderedFamily
from nodes.metrics.families import Family
from nodes.metrics.rowcache import RowCache

log = logging.getLogger(__name__)

# A proxy clock's offset is exported while a web worker learnt it this recently (seconds): a web
# worker republishes it every window (nodes/api/proxyclock.py), so one that stopped is gone within this.
PROXY_CLOCK_FRESH = 300.0


class FleetCollector:
    """A prometheus_client collector; `describe()` runs no query, so registering it is free."""

    def __init__(self) -> None:
        self.nodes = RowCache(_render_node)
        self.gpus = RowCache(_render_gpus)
        self.gpu_conditions = RowCache(_render_gpu_condition)
        self.disks = RowCache(_render_disk)
        self.allocations = RowCache(_Allocation)
        # Each node's GPU records, kept while the GPU conditions' cache gives the same list.
        self.held: tuple[list[RenderedGPU], dict[str, bytes]] = ([], {})

    def describe(self) -> list[Metric]:
        return [Metric(family.name, family.documentation, family.type) for family in families.ALL]

    def collect(self) -> Iterator[Metric]:
        scrape = Scrape.take(time.time())
        yield from self.fleet_families(scrape)
        yield from self_families(scrape.counters)

    def fleet_families(self, scrape: Scrape) -> Iterator[Metric]:
        """Everything but the control plane's own counters: what web.metrics.prerender renders ahead."""
        yield GaugeMetricFamily(
            families.LOADSTORE_UP.name, families.LOADSTORE_UP.documentation, value=int(scrape.redis_ok)
        )
        yield from self.fleet(scrape)

    def fleet(self, scrape: Scrape) -> Iterator[RenderedFamily]:
        inv = scrape.inventory
        # The last heartbeat changes with every beat, so it is no part of a node row's key.
        nodes = self.nodes.refresh(row.facts for row in inv.nodes)
        present = {row.facts.id for row in inv.nodes}
        allocations = self.allocations.refresh(row for row in inv.allocations if row.node in present)

        gpu_rows = [row for row in inv.gpu_conditions if row.node in present]
        conditions = self.gpu_conditions.refresh(gpu_rows)
        # Only the GPUs the inventory holds, and below only the shards allocated here (nodes/metrics/known.py).
        held_for, held = self.held
        if conditions is not held_for:
            held = known.gpu_records((row.node for row in gpu_rows), (text.record for text in conditions))
            self.held = (conditions, held)
        loads = known.held_chunks(scrape.loads, held)
        for index, family in enumerate(loadlines.STORED):
            yield rendered(family, [chunks[index] for chunks in loads])
        shards = _shard_samples(scrape.loads, {a.shard: a for a in allocations})
        cpu, memory = families.SHARD_CPU.name.encode(), families.SHARD_MEMORY.name.encode()
        yield rendered(families.SHARD_CPU, [cpu + s.labels + b" " + s.cores + b"\n" for s in shards])
        yield rendered(families.SHARD_MEMORY, [memory + s.labels + b" " + s.resident + b"\n" for s in shards])

        yield rendered(families.MEMORY_TOTAL, [node.memory_total for node in nodes])
        yield rendered(families.STATE, [node.state for node in nodes])
        yield rendered(families.INFO, [node.info for node in nodes])
        heartbeat = families.LAST_HEARTBEAT.name
        yield rendered(
            families.LAST_HEARTBEAT,
            [
                f"{heartbeat}{node.labels} {floatToGoString(row.last_heartbeat)}\n".encode()
                for node, row in zip(nodes, inv.nodes, strict=True)
                if row.last_heartbeat is not None
            ],
        )
        gpus = self.gpus.refresh(row for row in inv.gpus if row.node in present)
        yield rendered(families.GPUS, [text.count for text in gpus])
        yield rendered(families.GPUS_FREE, [text.free for text in gpus])
        yield rendered(families.GPU_MEMORY, [text.memory for text in gpus])
        yield rendered(families.GPU_HEALTH, [c.health for c in conditions])
        disks = self.disks.refresh(row for row in inv.disks if row.node in present)
        yield rendered(families.DISK_FREE, [text.free for text in disks])
        yield rendered(families.DISK_SIZE, [text.size for text in disks])
        yield rendered(families.SHARD_GPUS, [a.gpus for a in allocations])
        yield rendered(families.SHARD_MEMORY_CLAIM, [a.memory_claim for a in allocations])
        # A handful per node at most, rendered afresh: a state that changes is a series that ends.
        install = families.ENGINE_INSTALL.name
        yield rendered(
            families.ENGINE_INSTALL,
            [
                line(
                    install,
                    labelset(node=i.node, engine=i.engine, version=i.version, variant=i.variant, state=i.state),
                    1,
                ).encode()
                for i in inv.installs
                if i.node in present
            ],
        )


def rendered(family: Family, chunks: list[bytes]) -> RenderedFamily:
    return RenderedFamily(family.name, family.documentation, family.type, chunks)


class Scrape:
    """One scrape's data, all read before anything is written."""

    def __init__(self, inv: inventory_series.Inventory, fresh: list, counters: dict, redis_ok: bool):
        self.inventory = inv
        self.loads = fresh
        self.counters = counters
        self.redis_ok = redis_ok

    @classmethod
    def take(cls, now: float, margin: float = 0.0) -> Scrape:
        """Loads no longer fresh are left out; `margin`: seconds the answer is kept (loadstore.is_fresh)."""
        inv = inventory_series.read()
        node_ids = [row.facts.id for row in inv.nodes]
        try:
            lines = loadstore.read_lines(node_ids)
            pipe = livestate.client().pipeline(transaction=False)
            selfmetrics.queue_read(pipe)
            (counters,) = pipe.execute()
        except redis.RedisError as exc:
            # The inventory is still worth exporting; llmgw_loadstore_up says what is missing.
            log.warning("/metrics without loads: %s", exc)
            return cls(inv, [], {}, redis_ok=False)
        fresh = []
        since = loadstore.fresh_since(now, margin)
        for node_id, raw in zip(node_ids, lines, strict=True):
            stored = loadlines.parse(raw)
            if stored is not None and stored.received_at >= since:
                fresh.append((node_id, stored))
        return cls(inv, fresh, selfmetrics.read(counters), redis_ok=True)


class ShardSample(NamedTuple):
    labels: bytes
    cores: bytes
    resident: bytes


def _shard_samples(fresh: list, placed: dict) -> list[ShardSample]:
    """Every shard in a fresh load that is allocated to its node, labelled from its allocation.

    A shard its agent names but placement did not put there is left out: the name is the
    agent's word, and each new one would be a new series (nodes/metrics/known.py).
    """
    samples = []
    for node_id, stored in fresh:
        for shard, cores, resident in stored.shards:
            allocation = placed.get(shard.decode())
            if allocation is not None and allocation.node == node_id:
                samples.append(ShardSample(allocation.labels, cores, resident))
    return samples


class RenderedNode(NamedTuple):
    memory_total: bytes  # empty when the agent never said
    state: bytes
    info: bytes
    labels: str  # the label set {node="…"}, for the heartbeat line rendered on every scrape


def _render_node(facts: inventory_series.NodeFacts) -> RenderedNode:
    node = labelset(node=facts.id)
    info = labelset(
        agent_version=facts.agent_version,
        arch=facts.arch,
        cpu_model=facts.cpu_model,
        hostname=facts.hostname,
        kernel=facts.kernel,
        node=facts.id,
        os=facts.os,
        os_version=facts.os_version,
    )
    state = labelset(node=facts.id, state=derive_state(facts.admin_state, facts.liveness).value)
    memory = facts.memory_total_bytes
    return RenderedNode(
        memory_total=line(families.MEMORY_TOTAL.name, node, memory).encode() if memory is not None else b"",
        state=line(families.STATE.name, state, 1).encode(),
        info=line(families.INFO.sample, info, 1).encode(),
        labels=node,
    )


class RenderedGPUs(NamedTuple):
    count: bytes  # type: ignore[assignment]  # a field named as tuple's method: a NamedTuple allows it
    free: bytes
    memory: bytes


def _render_gpus(row: inventory_series.GPURow) -> RenderedGPUs:
    labels = labelset(**{"class": row.gpu_class, "node": row.node})
    return RenderedGPUs(
        count=line(families.GPUS.name, labels, row.count).encode(),
        free=line(families.GPUS_FREE.name, labels, row.free).encode(),
        memory=line(families.GPU_MEMORY.name, labels, row.memory or 0).encode(),
    )


class RenderedGPU(NamedTuple):
    health: bytes
    record: bytes  # the GPU as a load's GPU records list it (livestate.loadlines)


def _render_gpu_condition(row: inventory_series.GPUConditionRow) -> RenderedGPU:
    labels = labelset(gpu=str(row.index), node=row.node, state=row.condition, uuid=row.uuid)
    return RenderedGPU(
        line(families.GPU_HEALTH.name, labels, 1).encode(), loadlines.gpu_record(row.index, row.uuid).encode()
    )


class RenderedDisk(NamedTuple):
    free: bytes
    size: bytes


def _render_disk(row: inventory_series.DiskRow) -> RenderedDisk:
    node = labelset(node=row.node)
    return RenderedDisk(
        free=line(families.DISK_FREE.name, node, row.free).encode(),
        size=line(families.DISK_SIZE.name, node, row.size).encode(),
    )


class _Allocation:
    __slots__ = ("gpus", "labels", "memory_claim", "node", "shard")

    def __init__(self, row: inventory_series.AllocationRow):
        self.node, self.shard = row.node, row.shard
        labels = labelset(
            model=row.model, node=row.node, replica=row.replica, served_model=row.served_model, shard=row.shard
        )
        self.labels = labels.encode()
        self.gpus = line(families.SHARD_GPUS.name, labels, row.gpus).encode()
        self.memory_claim = line(families.SHARD_MEMORY_CLAIM.name, labels, row.memory_gb * 2**30).encode()


def _histogram(family: Family, counters: dict[str, float], name: str, bounds: tuple[float, ...]) -> Metric:
    """A histogram kept in the self-metrics hash as a field per bucket (selfmetrics.bucket_field) and a sum."""
    buckets, cumulative = [], 0.0
    for bound in (*bounds, float("inf")):
        cumulative += counters.get(selfmetrics.bucket_field(bound, name), 0)
        buckets.append((floatToGoString(bound), cumulative))
    return HistogramMetricFamily(
        family.name, family.documentation, buckets=buckets, sum_value=counters.get(f"{name}:sum", 0.0)
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
    yield _histogram(families.HEARTBEAT_SECONDS, counters, "heartbeat_seconds", selfmetrics.HEARTBEAT_BUCKETS)
    yield _histogram(families.PROXY_WAIT_SECONDS, counters, "proxy_wait_seconds", selfmetrics.PROXY_WAIT_BUCKETS)
    clocks = GaugeMetricFamily(
        families.PROXY_CLOCK_OFFSET.name, families.PROXY_CLOCK_OFFSET.documentation, labels=["proxy", "web_host"]
    )
    for (proxy, host), offset in sorted(selfmetrics.proxy_clocks(counters, time.time() - PROXY_CLOCK_FRESH).items()):
        clocks.add_metric([proxy, host], offset)
    yield clocks
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
    yield CounterMetricFamily(
        families.STALE_GRACED.name, families.STALE_GRACED.documentation, value=counters.get("swept:graced", 0)
    )
