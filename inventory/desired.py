"""What each node's agent should run: its shards as `protocol.ShardSpec`, built from their deployments.

The heartbeat reply carries this list, whole, every time: the agent starts
what is new and stops what is gone, so a lost reply costs nothing but a beat.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass

from agent import protocol
from inventory import shardversion
from inventory.models import RUN_STATES, Deployment, Engine, ReplicaState, Shard
from inventory.replicas import apply_reports, read_reports

# Engines listen on every address: Prometheus and clients reach them from elsewhere.
LISTEN = "0.0.0.0"


@dataclass
class _Cached:
    version: tuple[int, int]
    read_at: float
    shards: list[Shard]
    specs: list[protocol.ShardSpec]


# Per process: each node's shards as last read, valid while the shard version stands still.
_cache: dict[str, _Cached] = {}


def forget() -> None:
    """Drop every cached shard list (tests start each case from the database)."""
    _cache.clear()


def sync_node(
    node_id: str, reports: Iterable[protocol.ShardStatus] | None = None, use_cache: bool = True
) -> list[protocol.ShardSpec]:
    """Apply the agent's shard reports (None: no report to apply), then return the shards it should run.

    A heartbeat that changes nothing costs one Redis GET: the node's shards
    are kept in memory until the shard version moves. Otherwise one query
    reads them, and writes happen only for what a report changed. `use_cache`
    False (Redis is known to be down) goes to the database without asking Redis.
    """
    version = shardversion.current(node_id) if use_cache else None
    cached = _cache.get(node_id)
    if (
        cached is not None
        and cached.version == version
        and time.monotonic() - cached.read_at < shardversion.MAX_AGE
        and (reports is None or not read_reports(node_id, cached.shards, reports))
    ):
        return cached.specs
    shards = list(
        Shard.objects.filter(node_id=node_id, state__in=(*RUN_STATES, ReplicaState.RELEASING))
        .select_related("replica__deployment")
        .order_by("shard_id")
    )
    effects = read_reports(node_id, shards, reports) if reports is not None else None
    gone = apply_reports(effects) if effects else set()
    wanted = [s for s in shards if s.state in RUN_STATES and s.shard_id not in gone]
    leaders = _leaders([s.replica for s in wanted if s.replica.deployment.shards_per_replica > 1])
    specs = [shard_spec(s, leaders.get(s.replica_id, "")) for s in wanted]
    if effects or version is None:
        _cache.pop(node_id, None)
    else:
        _cache[node_id] = _Cached(version, time.monotonic(), shards, specs)
    return specs


def _leaders(replicas) -> dict[int, str]:
    """The address of shard 0 of each multi-node replica: where the others join it."""
    if not replicas:
        return {}
    rows = Shard.objects.filter(replica__in=replicas, index=0).values_list(
        "replica_id", "node__mgmt_addr", "node__hostname", "node_id", "port"
    )
    return {replica: f"{addr or host or node}:{port}" for replica, addr, host, node, port in rows}


def shard_spec(shard: Shard, leader: str = "") -> protocol.ShardSpec:
    replica = shard.replica
    deployment = replica.deployment
    env = {
        # Empty for CPU engines on purpose: it hides every GPU from them.
        "CUDA_VISIBLE_DEVICES": ",".join(str(i) for i in shard.gpu_indices),
        "LLMGW_SHARD": shard.shard_id,
        "LLMGW_REPLICA": replica.replica_id,
        "LLMGW_SHARD_INDEX": str(shard.index),
        "LLMGW_SHARD_COUNT": str(deployment.shards_per_replica),
    }
    if replica.fabric:
        env["NCCL_IB_HCA"] = ",".join(shard.hcas)
    if leader:
        env["LLMGW_LEADER"] = leader
    return protocol.ShardSpec(
        shard=shard.shard_id,
        replica=replica.replica_id,
        model=deployment.model_source,
        engine=deployment.engine,
        command=command(deployment, shard, leader),
        env=env,
        port=shard.port,
    )


def command(deployment: Deployment, shard: Shard, leader: str = "") -> list[str]:
    """The engine's command line for one shard, from its engine's template and the deployment's arguments."""
    model, port, extra = deployment.model_source, str(shard.port), deployment.argv()
    gpus = deployment.gpus_per_shard
    shards = deployment.shards_per_replica
    match deployment.engine:
        case Engine.VLLM:
            argv = ["vllm", "serve", model, "--host", LISTEN, "--port", port]
            if gpus > 1:
                argv += ["--tensor-parallel-size", str(gpus)]
            if shards > 1:
                argv += ["--pipeline-parallel-size", str(shards)]
        case Engine.SGLANG:
            argv = ["python3", "-m", "sglang.launch_server", "--model-path", model, "--host", LISTEN, "--port", port]
            if gpus > 1:
                argv += ["--tp-size", str(gpus)]
            if shards > 1:
                argv += ["--nnodes", str(shards), "--node-rank", str(shard.index), "--dist-init-addr", leader]
        case Engine.LLAMA_CPP:
            argv = ["llama-server", "--model", model, "--host", LISTEN, "--port", port, "--metrics"]
            if deployment.cpu_cores_per_shard:
                argv += ["--threads", str(deployment.cpu_cores_per_shard)]
            if gpus:
                argv += ["--n-gpu-layers", "999"]
        case Engine.DEMO:
            argv = ["python3", "-m", "agent.demo_engine", "--host", LISTEN, "--port", port, "--model", model]
        case _:
            return [word.replace("{port}", port).replace("{model}", model) for word in extra]
    return argv + extra
