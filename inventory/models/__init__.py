"""The inventory: nodes, their hardware, and what is placed on them."""

from inventory.models.allocations import Allocation, GPUClaim
from inventory.models.choices import STATE_COLOURS, AdminState, Liveness, NodeState, derive_state
from inventory.models.deployments import (
    LIVE_STATES,
    REPLICA_COLOURS,
    RUN_STATES,
    Deployment,
    Engine,
    Replica,
    ReplicaState,
    Shard,
)
from inventory.models.fabrics import FabricAttachment
from inventory.models.gpus import GPU, gpu_class
from inventory.models.nodes import EngineInstall, Node, NodeEvent, actor_name
from inventory.models.storage import Filesystem, Weights

__all__ = [
    "GPU",
    "LIVE_STATES",
    "REPLICA_COLOURS",
    "RUN_STATES",
    "STATE_COLOURS",
    "AdminState",
    "Allocation",
    "Deployment",
    "Engine",
    "EngineInstall",
    "FabricAttachment",
    "Filesystem",
    "GPUClaim",
    "Liveness",
    "Node",
    "NodeEvent",
    "NodeState",
    "Replica",
    "ReplicaState",
    "Shard",
    "Weights",
    "actor_name",
    "derive_state",
    "gpu_class",
]
