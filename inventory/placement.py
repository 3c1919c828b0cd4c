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
from dataclasses import dataclass

from inventory.fleet import Fleet, NodeView, Placement, Profile, ShardPlacement, load_fleet
from inventory.placement_reasons import diagnose

# The snapshot's types live in inventory.fleet; callers of placement find them here too.
__all__ = [
    "FIRST_ENGINE_PORT",
    "CannotPlace",
    "Fleet",
    "NodeView",
    "Placement",
    "Planner",
    "Profile",
    "ShardPlacement",
    "load_fleet",
]

# Engines listen from here upwards, clear of the control plane's own ports.
FIRST_ENGINE_PORT = 20000


@dataclass
class CannotPlace:
    """Why a replica has no place, worded for the operator who must act on it."""

    reason: str


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
            chosen: list[tuple[str, int]] = []
            taken: list[tuple] = []
            remaining = self.profile.shards
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
