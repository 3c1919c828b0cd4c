"""The fleet as placement sees it: a snapshot of every node and what is still free on it.

`load_fleet` reads it in a fixed number of queries, whatever the fleet size;
`Fleet.apply` takes a placement's claims in memory, so the next replica in the
same pass sees what the last one took. The planner (`inventory.placement`)
and the reasons (`inventory.placement_reasons`) both read these types.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field

from django.db.models import Count, Sum

from inventory import engine_wants
from inventory.models import (
    GPU,
    RUN_STATES,
    Allocation,
    Deployment,
    FabricAttachment,
    Node,
    NodeState,
    ReplicaState,
    Shard,
    Weights,
    derive_state,
)


@dataclass(frozen=True)
class Profile:
    """What one replica needs: `shards` × (GPUs of a class, memory, cores), and maybe weights."""

    shards: int = 1
    gpus: int = 0
    gpu_class: str = ""
    memory_gb: int = 0
    cpu_cores: int = 0
    weights_path: str = ""
    # Set only for engines llmgw installs: a node whose install of it failed is not used.
    engine: str = ""
    variant: str = ""

    @classmethod
    def of(cls, deployment: Deployment) -> Profile:
        installed = deployment.engine in engine_wants.INSTALLED_BY_LLMGW
        return cls(
            shards=deployment.shards_per_replica,
            gpus=deployment.gpus_per_shard,
            gpu_class=deployment.gpu_class if deployment.gpus_per_shard else "",
            memory_gb=deployment.memory_gb_per_shard,
            cpu_cores=deployment.cpu_cores_per_shard,
            weights_path=deployment.model_source if deployment.model_is_path else "",
            engine=deployment.engine if installed else "",
            variant=engine_wants.variant(deployment.gpus_per_shard) if installed else "",
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
    """What placement knows of one node: its state and what is still free.

    `free_gpus` are the node's free GPUs (GPU.objects.free()) whatever its
    state; `schedulable` says whether placement may use them.
    """

    id: str
    state: NodeState
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
    # (engine, variant) whose install failed here or cannot run here, with why.
    engine_blocked: dict[tuple[str, str], str] = field(default_factory=dict)

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

    def engine_block(self, profile: Profile) -> str:
        """Why the profile's engine cannot be used here, or "" when it is ready or may be installed."""
        return self.engine_blocked.get((profile.engine, profile.variant), "") if profile.engine else ""

    def capacity(self, profile: Profile) -> int:
        """How many of the replica's shards fit here (at most all of them)."""
        if not self.schedulable or not self.has_weights(profile.weights_path) or self.engine_block(profile):
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


def load_fleet(weights_paths: Iterable[str] = ()) -> Fleet:
    """Read every node and what is free on it, in a fixed number of queries."""
    views = {
        node_id: NodeView(
            id=node_id,
            state=derive_state(admin_state, liveness),
            memory_total_gb=memory / 2**30 if memory else None,
            cpus=cpus,
            weights_scanned=scanned,
        )
        for node_id, admin_state, liveness, memory, cpus, scanned in Node.objects.values_list(
            "id", "admin_state", "liveness", "memory_total_bytes", "cpus", "weights_scanned"
        ).order_by()
    }
    gpus = GPU.objects.with_free().values_list("node_id", "index", "gpu_class", "is_free").order_by("node_id", "index")
    for node_id, index, gpu_class, is_free in gpus:
        node = views[node_id]
        node.gpu_count[gpu_class] += 1
        if is_free:
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
    for node_id, blocked in engine_wants.blocked_installs().items():
        views[node_id].engine_blocked = blocked
    return Fleet(views.values())
