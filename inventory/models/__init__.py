"""The inventory: nodes, their hardware, and what is placed on them."""

from inventory.models.allocations import Allocation, GPUClaim
from inventory.models.choices import (
    STATE_COLOURS,
    STATE_RULES,
    AdminState,
    Liveness,
    NodeState,
    derive_state,
    state_order,
    state_q,
)
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
from inventory.models.gpus import CONDITION_COLOURS, GPU, HEALTH_OK, GPUCondition, free_q, gpu_class
from inventory.models.nodes import AGENT_FIELDS, EngineInstall, Node, NodeEvent, actor_name
from inventory.models.storage import Filesystem, Weights

__all__ = [
    "AGENT_FIELDS",
    "CONDITION_COLOURS",
    "GPU",
    "HEALTH_OK",
    "LIVE_STATES",
    "REPLICA_COLOURS",
    "RUN_STATES",
    "STATE_COLOURS",
    "STATE_RULES",
    "AdminState",
    "Allocation",
    "Deployment",
    "Engine",
    "EngineInstall",
    "FabricAttachment",
    "Filesystem",
    "GPUClaim",
    "GPUCondition",
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
    "free_q",
    "gpu_class",
    "state_order",
    "state_q",
]
