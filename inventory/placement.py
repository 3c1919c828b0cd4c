"""Placement: finding nodes for every shard of one replica, or saying why there are none.

The fleet is read once, in a handful of bulk queries, into plain objects; the
decisions are pure Python over that snapshot, so placing a thousand replicas
costs the same few queries as placing one, and the rules can be tested over
random fleets without a database. A placed replica is applied to the snapshot
at once, so the next replica in the same pass sees what the last one took.

The rules: a replica is placed whole or not at all; only schedulable nodes
(alive and active); GPUs free, healthy and of the class asked; host memory and
cores claimed never beyond a node's total (an undeclared claim, or an unknown
total, constrains nothing); a path source only where the node has it or never
looked; a replica on several nodes only within one fabric, each shard given
that fabric's adapters alone. Among the nodes that fit, the ones holding fewest
replicas of the same deployment come first (spread), then GPU replicas pack
tightly (keeping whole machines free for big replicas) while CPU replicas go
where fewest shards run, then the node id: the same fleet always gives the
same answer.
"""

from __future__ import annotations

import heapq
from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field

from django.db.models import Count, Sum

from inventory.models import (
    GPU,
    RUN_STATES,
    Allocation,
    Deployment,
    FabricAttachment,
    GPUClaim,
    Node,
    NodeState,
    ReplicaState,
    Shard,
    Weights,
    derive_state,
)
from inventory.models.gpus import HEALTH_OK
from inventory.placement_reasons import diagnose

# Engines listen from here upwards, clear of the control plane's own ports.
FIRST_ENGINE_PORT = 20000


@dataclass(frozen=True)
class Profile:
    """What one replica needs: `shards` × (GPUs of a class, memory, cores), and maybe weights."""

    shards: int = 1
    gpus: int = 0
    gpu_class: str = ""
    memory_gb: int = 0
    cpu_cores: int = 0
    weights_path: str = ""

    @classmethod
    def of(cls, deployment: Deployment) -> Profile:
        return cls(
            shards=deployment.shards_per_replica,
            gpus=deployment.gpus_per_shard,
            gpu_class=deployment.gpu_class if deployment.gpus_per_shard else "",
            memory_gb=deployment.memory_gb_per_shard,
            cpu_cores=deployment.cpu_cores_per_shard,
            weights_path=deployment.model_source if deployment.model_is_path else "",
        )

    def describe(self) -> str:
        need = []
        if self.gpus:
            need.append(f"{self.gpus} × {self.gpu_class or 'GPU'}")
        if self.memory_gb:
            need.append(f"{self.memory_gb} GB memory")
        if self.cpu_cores:
            need.append(f"{self.cpu_cores} cores")
        each = " + ".join(need) or "nothing in particular"
        return each if self.shards == 1 else f"{self.shards} shards of {each}"


@dataclass
class NodeView:
    """What placement knows of one node: its state and what is still free."""

    id: str
    state: NodeState
    address: str = ""
    memory_total_gb: float | None = None
    memory_claimed_gb: int = 0
    cpus: int = 0
    cores_claimed: int = 0
    shard_count: int = 0
    # Healthy, unclaimed GPUs by class, each list sorted.
    free_gpus: dict[str, list[int]] = field(default_factory=dict)
    # Every GPU by class, whatever its health or claim: for the reasons.
    gpu_count: Counter = field(default_factory=Counter)
    fabrics: dict[str, list[str]] = field(default_factory=dict)
    weights_scanned: bool = False
    weights: set[str] = field(default_factory=set)
    ports: set[int] = field(default_factory=set)

    @property
    def schedulable(self) -> bool:
        return self.state == NodeState.READY

    def gpus_of(self, gpu_class: str) -> list[int]:
        if gpu_class:
            return self.free_gpus.get(gpu_class, [])
        return sorted(i for indices in self.free_gpus.values() for i in indices)

    def memory_free_gb(self) -> float | None:
        if self.memory_total_gb is None:
            return None
        return self.memory_total_gb - self.memory_claimed_gb

    def cores_free(self) -> int | None:
        return self.cpus - self.cores_claimed if self.cpus else None

    def has_weights(self, path: str) -> bool:
        return not path or not self.weights_scanned or path in self.weights

    def capacity(self, profile: Profile) -> int:
        """How many of the replica's shards fit here (at most all of them)."""
        if not self.schedulable or not self.has_weights(profile.weights_path):
            return 0
        fits = profile.shards
        if profile.gpus:
            fits = min(fits, len(self.gpus_of(profile.gpu_class)) // profile.gpus)
        memory = self.memory_free_gb()
        if profile.memory_gb and memory is not None:
            fits = min(fits, int(memory // profile.memory_gb))
        cores = self.cores_free()
        if profile.cpu_cores and cores is not None:
            fits = min(fits, cores // profile.cpu_cores)
        return max(fits, 0)


@dataclass
class ShardPlacement:
    index: int
    node_id: str
    gpus: list[int]
    hcas: list[str]
    port: int


@dataclass
class Placement:
    """Where each shard of one replica goes; `fabric` is empty when it is on one node."""

    shards: list[ShardPlacement]
    fabric: str = ""

    @property
    def node_ids(self) -> list[str]:
        return sorted({shard.node_id for shard in self.shards})


@dataclass
class CannotPlace:
    """Why a replica has no place, worded for the operator who must act on it."""

    reason: str


class Fleet:
    """A snapshot of the nodes, updated in memory as replicas are placed on it."""

    def __init__(self, nodes: Iterable[NodeView]):
        self.nodes = {node.id: node for node in nodes}
        # Only schedulable nodes can take anything; GPU replicas look only at
        # nodes with free GPUs of their class rather than at the whole fleet.
        self._ready = [node for node in self.nodes.values() if node.schedulable]
        self._by_class: dict[str, set[str]] = defaultdict(set)
        for node in self._ready:
            for gpu_class, indices in node.free_gpus.items():
                if indices:
                    self._by_class[gpu_class].add(node.id)

    def candidates(self, profile: Profile) -> Iterable[NodeView]:
        if profile.gpus and profile.gpu_class:
            return (self.nodes[node_id] for node_id in self._by_class.get(profile.gpu_class, ()))
        if profile.gpus:
            ids = set().union(*self._by_class.values()) if self._by_class else set()
            return (self.nodes[node_id] for node_id in ids)
        return self._ready

    def apply(self, placement: Placement, profile: Profile) -> None:
        """Take what a placement claims, so later decisions in this pass see it."""
        for shard in placement.shards:
            node = self.nodes[shard.node_id]
            taken = set(shard.gpus)
            for gpu_class in list(node.free_gpus):
                node.free_gpus[gpu_class] = [i for i in node.free_gpus[gpu_class] if i not in taken]
                if not node.free_gpus[gpu_class]:
                    self._by_class[gpu_class].discard(node.id)
            node.memory_claimed_gb += profile.memory_gb
            node.cores_claimed += profile.cpu_cores
            node.shard_count += 1
            node.ports.add(shard.port)


class Planner:
    """Places the replicas of one deployment, one at a time, over a shared fleet.

    Candidates sit in heaps keyed by preference: one for whole replicas on a
    single node, one per fabric for replicas spread over several. Keys only
    grow as this planner fills a node, so an entry that no longer matches its
    node is pushed again with its current key (or dropped once the node is
    full) when it reaches the top; each placement costs a few heap operations
    instead of a scan of the fleet.
    """

    def __init__(self, fleet: Fleet, profile: Profile, spread: Counter | None = None):
        self.fleet = fleet
        self.profile = profile
        self.spread = spread if spread is not None else Counter()
        self._single: list[tuple] = []
        self._by_fabric: dict[str, list[tuple]] | None = None
        self._failed: CannotPlace | None = None
        # The heaps start from keys worked out from GPUs alone, never above
        # the true key: `_top` checks the rest (memory, cores, weights) only
        # for the few nodes that reach the top.
        for node in fleet.candidates(profile):
            key = self._rough_key(node)
            if key is not None:
                self._single.append(key)
        heapq.heapify(self._single)

    def place(self) -> Placement | CannotPlace:
        """Place one replica and apply it to the fleet, or say why not."""
        if self._failed is not None:
            # Nothing this planner did since can have freed room.
            return self._failed
        node = self._best_single_node()
        placement = self._on_one_node(node) if node is not None else self._across_nodes()
        if placement is None:
            self._failed = CannotPlace(diagnose(self.fleet, self.profile))
            return self._failed
        self.fleet.apply(placement, self.profile)
        for node_id in placement.node_ids:
            self.spread[node_id] += 1
            self._refresh(self.fleet.nodes[node_id])
        return placement

    # -- one node --------------------------------------------------------------------------------

    def _single_key(self, node: NodeView) -> tuple | None:
        if node.capacity(self.profile) < self.profile.shards:
            return None
        if self.profile.gpus:
            leftover = len(node.gpus_of(self.profile.gpu_class)) - self.profile.gpus * self.profile.shards
            return (self.spread[node.id], leftover, node.id)
        return (self.spread[node.id], node.shard_count, node.id)

    def _rough_key(self, node: NodeView, fabric: bool = False) -> tuple | None:
        """A lower bound of `_single_key` (or of `_fabric_key`), from GPU counts alone."""
        profile = self.profile
        spread = self.spread[node.id]
        if not profile.gpus:
            return (spread, -profile.shards, node.id) if fabric else (spread, node.shard_count, node.id)
        free = len(node.gpus_of(profile.gpu_class))
        if fabric:
            fits = min(profile.shards, free // profile.gpus)
            return (spread, -fits, node.id) if fits else None
        leftover = free - profile.gpus * profile.shards
        return (spread, leftover, node.id) if leftover >= 0 else None

    def _best_single_node(self) -> NodeView | None:
        return self._top(self._single, self._single_key)

    def _on_one_node(self, node: NodeView) -> Placement:
        return Placement(self._assign(node, range(self.profile.shards), hcas=[]))

    # -- several nodes on one fabric -------------------------------------------------------------

    def _fabric_key(self, node: NodeView) -> tuple | None:
        fits = node.capacity(self.profile)
        return (self.spread[node.id], -fits, node.id) if fits else None

    def _fabric_heaps(self) -> dict[str, list[tuple]]:
        if self._by_fabric is None:
            self._by_fabric = defaultdict(list)
            for node in self.fleet.candidates(self.profile):
                key = self._rough_key(node, fabric=True) if node.fabrics else None
                if key is not None:
                    for fabric in node.fabrics:
                        self._by_fabric[fabric].append(key)
            for heap in self._by_fabric.values():
                heapq.heapify(heap)
        return self._by_fabric

    def _across_nodes(self) -> Placement | None:
        """The fabric needing fewest nodes for the whole replica, then its name."""
        if self.profile.shards < 2:
            return None
        best: tuple[int, str, list[tuple[str, int]]] | None = None
        for fabric, heap in sorted(self._fabric_heaps().items()):
            chosen, taken, remaining = [], [], self.profile.shards
            while remaining and self._top(heap, self._fabric_key) is not None:
                key = heapq.heappop(heap)
                if any(node_id == key[-1] for node_id, _ in chosen):
                    # A re-keyed stale entry can equal the node's fresh one: a duplicate, dropped.
                    continue
                taken.append(key)
                take = min(-key[1], remaining)
                chosen.append((key[-1], take))
                remaining -= take
            for key in taken:
                heapq.heappush(heap, key)
            if not remaining and (best is None or len(chosen) < best[0]):
                best = (len(chosen), fabric, chosen)
        if best is None:
            return None
        _, fabric, chosen = best
        shards, next_index = [], 0
        for node_id, take in chosen:
            node = self.fleet.nodes[node_id]
            shards += self._assign(node, range(next_index, next_index + take), node.fabrics[fabric])
            next_index += take
        return Placement(shards, fabric)

    # -- shared ----------------------------------------------------------------------------------

    def _top(self, heap: list[tuple], key_of) -> NodeView | None:
        """The best node of a heap whose entry is current; stale entries are re-keyed or dropped."""
        while heap:
            key = heap[0]
            node = self.fleet.nodes[key[-1]]
            current = key_of(node)
            if current == key:
                return node
            if current is None:
                heapq.heappop(heap)
            else:
                heapq.heapreplace(heap, current)
        return None

    def _refresh(self, node: NodeView) -> None:
        """Push a node this planner just filled with its new keys, so the heaps never miss it."""
        key = self._single_key(node)
        if key is not None:
            heapq.heappush(self._single, key)
        if self._by_fabric is not None:
            key = self._fabric_key(node)
            if key is not None:
                for fabric in node.fabrics:
                    heapq.heappush(self._by_fabric[fabric], key)

    def _assign(self, node: NodeView, indices: Iterable[int], hcas: list[str]) -> list[ShardPlacement]:
        free = node.gpus_of(self.profile.gpu_class) if self.profile.gpus else []
        ports = set(node.ports)
        shards = []
        for n, index in enumerate(indices):
            port = FIRST_ENGINE_PORT
            while port in ports:
                port += 1
            ports.add(port)
            gpus = free[n * self.profile.gpus : (n + 1) * self.profile.gpus]
            shards.append(ShardPlacement(index, node.id, gpus, list(hcas), port))
        return shards


def load_fleet(weights_paths: Iterable[str] = ()) -> Fleet:
    """Read every node and what is free on it, in a fixed number of queries."""
    views = {
        node_id: NodeView(
            id=node_id,
            state=derive_state(admin_state, liveness),
            address=mgmt_addr or hostname or node_id,
            memory_total_gb=memory / 2**30 if memory else None,
            cpus=cpus,
            weights_scanned=scanned,
        )
        for node_id, admin_state, liveness, mgmt_addr, hostname, memory, cpus, scanned in Node.objects.values_list(
            "id", "admin_state", "liveness", "mgmt_addr", "hostname", "memory_total_bytes", "cpus", "weights_scanned"
        ).order_by()
    }
    claimed = set(GPUClaim.objects.values_list("node_id", "gpu_index").order_by())
    gpus = GPU.objects.values_list("node_id", "index", "gpu_class", "health").order_by("node_id", "index")
    for node_id, index, gpu_class, health in gpus:
        node = views[node_id]
        node.gpu_count[gpu_class] += 1
        if health == HEALTH_OK and (node_id, index) not in claimed:
            node.free_gpus.setdefault(gpu_class, []).append(index)
    totals = (
        Allocation.objects.values("node_id")
        .order_by()
        .annotate(memory=Sum("memory_gb"), cores=Sum("cpu_cores"), shards=Count("id"))
        .values_list("node_id", "memory", "cores", "shards")
    )
    for node_id, memory, cores, shards in totals:
        node = views[node_id]
        node.memory_claimed_gb, node.cores_claimed, node.shard_count = memory or 0, cores or 0, shards
    for node_id, fabric, hcas in FabricAttachment.objects.values_list("node_id", "fabric", "hcas").order_by():
        views[node_id].fabrics[fabric] = list(hcas)
    paths = sorted(set(weights_paths))
    if paths:
        for node_id, path in Weights.objects.filter(path__in=paths).values_list("node_id", "path").order_by():
            views[node_id].weights.add(path)
    # A releasing shard still holds its port until its engine has stopped.
    holding = (*RUN_STATES, ReplicaState.RELEASING)
    for node_id, port in Shard.objects.filter(state__in=holding, node__isnull=False).values_list("node_id", "port"):
        views[node_id].ports.add(port)
    return Fleet(views.values())
