"""Every family /metrics exports: its name, help text and type, in export order.

The names of the load and shard families are fixed in docs/design.md ("Fixed points"). Every node
family has the label `node`; shard families also `shard`, `replica`, `model`.
"""

from __future__ import annotations

from livestate.loadlines import (
    GPU_LOAD,
    NODE_LOAD,
    Family,
)

# The node load families are defined beside the text a heartbeat renders from them
# (livestate.loadlines); the rest are read from the database or the self-metrics hash.
SHARD_CPU = Family("llmgw_shard_cpu_cores", "CPU cores busy in the shard's engine processes.")
SHARD_MEMORY = Family("llmgw_shard_memory_bytes", "Resident memory of the shard's engine processes.")

# From the inventory; they stay while the node is in it, whatever its load.
MEMORY_TOTAL = Family("llmgw_node_memory_bytes", "Memory installed (MemTotal), as the agent reported it.")
STATE = Family("llmgw_node_state", "The node's displayed state, as the label state; always 1.")
INFO = Family("llmgw_node", "The node's host facts as labels; always 1.", "info")
LAST_HEARTBEAT = Family(
    "llmgw_node_last_heartbeat_timestamp_seconds", "When the last heartbeat arrived, on the control plane's clock."
)
GPUS = Family("llmgw_node_gpus", "GPUs of the class on the node.")
GPUS_FREE = Family("llmgw_node_gpus_free", "GPUs of the class that are healthy and held by no shard.")
GPU_MEMORY = Family("llmgw_node_gpu_memory_bytes", "Memory of the node's GPUs of the class, summed.")
GPU_HEALTH = Family(
    "llmgw_gpu_health", "Each GPU's condition (healthy, degraded or failed) as the label state; always 1."
)
DISK_FREE = Family("llmgw_node_local_disk_free_bytes", "Free bytes on the node's own (not shared) model filesystems.")
DISK_SIZE = Family("llmgw_node_local_disk_size_bytes", "Size of the node's own (not shared) model filesystems.")
SHARD_GPUS = Family("llmgw_shard_allocated_gpus", "GPUs allocated to the shard.")
SHARD_MEMORY_CLAIM = Family("llmgw_shard_memory_claim_bytes", "Host memory the shard's profile claimed on the node.")
ENGINE_INSTALL = Family(
    "llmgw_engine_install_state",
    "An engine install the node's agent reported, its state (installing, ready, failed, unsupported) "
    "as the label state; always 1.",
)

INVENTORY = (
    MEMORY_TOTAL,
    STATE,
    INFO,
    LAST_HEARTBEAT,
    GPUS,
    GPUS_FREE,
    GPU_MEMORY,
    GPU_HEALTH,
    DISK_FREE,
    DISK_SIZE,
    SHARD_GPUS,
    SHARD_MEMORY_CLAIM,
    ENGINE_INSTALL,
)
SHARD_LOAD = (SHARD_CPU, SHARD_MEMORY)

# The control plane's own, from the self-metrics hash in Redis.
LOADSTORE_UP = Family("llmgw_loadstore_up", "1 if this scrape could read the loads from Redis, else 0.")
HEARTBEATS_ACCEPTED = Family("llmgw_heartbeats_accepted", "Heartbeats accepted.", "counter")
HEARTBEATS_REJECTED = Family("llmgw_heartbeats_rejected", "Heartbeats rejected, by reason.", "counter")
HEARTBEAT_SECONDS = Family("llmgw_heartbeat_handling_seconds", "Time to handle one heartbeat.", "histogram")
STALE_SWEEPS = Family("llmgw_stale_sweeps", "Runs of the stale-marking task.", "counter")
NODES_MARKED = Family("llmgw_stale_nodes_marked", "Nodes the stale-marking task moved, by new liveness.", "counter")
STALE_FAILURES = Family("llmgw_stale_sweep_failures", "Nodes the stale-marking task failed to mark.", "counter")
STALE_HELD = Family(
    "llmgw_stale_sweeps_held",
    "Runs of the stale-marking task that marked no node lost because most of the fleet was unreachable at once.",
    "counter",
)
STALE_GRACED = Family(
    "llmgw_stale_sweeps_graced",
    "Runs of the stale-marking task that marked no node because the control plane was out or behind on its heartbeats.",
    "counter",
)
PROXY_WAIT_SECONDS = Family(
    "llmgw_heartbeat_proxy_wait_seconds",
    "Time an accepted heartbeat waited in the proxy for a web worker, its clock's offset taken off.",
    "histogram",
)
PROXY_CLOCK_OFFSET = Family(
    "llmgw_proxy_clock_offset_seconds",
    "A web host's clock minus a proxy's, as the proxy's health checks show it (positive: the proxy is behind).",
)

SELF = (
    HEARTBEATS_ACCEPTED,
    HEARTBEATS_REJECTED,
    HEARTBEAT_SECONDS,
    PROXY_WAIT_SECONDS,
    PROXY_CLOCK_OFFSET,
    STALE_SWEEPS,
    NODES_MARKED,
    STALE_FAILURES,
    STALE_HELD,
    STALE_GRACED,
)

ALL = (LOADSTORE_UP, *NODE_LOAD, *GPU_LOAD, *SHARD_LOAD, *INVENTORY, *SELF)
