"""What each node's agent should run: its shards as `protocol.ShardSpec`, built from their deployments.

The heartbeat reply carries this list, whole, every time: the agent starts
what is new and stops what is gone, so a lost reply costs nothing but a beat.

Every web worker answers every node, so each node's list is cached in Redis,
where all of them share it, under the shard version it was read at
(`livestate.shardlists`, `livestate.shardversion`). A heartbeat that changes
nothing reads it in the round trip it makes anyway (`livestate.beatscript`); a
moved version, an agent's report that changes a shard, or an expired entry sends
that node back to the database once. Celery beat keeps every node's list stored
afresh (`keep_cached`, livestate.keeping), so that entries do not expire while
the control plane runs, and a fleet back from a partition finds them.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import NamedTuple

from django.conf import settings

from agent import enginekinds, protocol
from inventory import drainhold, endpoints, engine_wants
from inventory.models import RUN_STATES, Deployment, Node, ReplicaState, Shard
from inventory.replicas import apply_reports, read_reports
from lib.compiledquery import CompiledQuery
from livestate import shardlists
from livestate.shardlists import CachedShards, ReplicaName, ShardFacts


class Orders(NamedTuple):
    """What one heartbeat reply tells an agent: the shards to run and the engines to install for them."""

    shards: list[protocol.ShardSpec]
    engines: list[protocol.EngineWant]
    # What `orders(..., defer_cache=True)` left for its caller to cache, on a pipeline it sends anyway.
    to_cache: CachedShards | None = None


def from_cache(
    node_id: str,
    version: tuple[int, int],
    raw: bytes | None,
    reports: Iterable[protocol.ShardStatus] | None,
) -> Orders | None:
    """The cached orders if `raw` was stored under `version` and the reports change none of its shards; else None."""
    cached = shardlists.decode(raw, version)
    if cached is None:
        return None
    if reports is not None and read_reports(node_id, cached.shards, reports):
        return None
    return Orders(cached.specs, cached.engines)


def orders(
    node_id: str,
    reports: Iterable[protocol.ShardStatus] | None = None,
    use_cache: bool = True,
    version: tuple[int, int] | None = None,
    defer_cache: bool = False,
) -> Orders:
    """Apply the agent's shard reports (None: no report to apply), then return what it should run and install.

    With the cache current this costs one Redis round trip and no query.
    Otherwise one query (compiled once per process) reads the node's shards, writes happen only for what a
    report changed, and the result is cached for the next heartbeat. `use_cache`
    False (Redis is known to be down) goes to the database without asking Redis.
    `version` is the node's shard version when the caller has just read it and
    found the cache of no use: the database is read at once, and cached under it.
    `defer_cache` leaves the caching to the caller (`Orders.to_cache`), which
    saves the heartbeat a round trip of its own.
    """
    if not use_cache:
        version = None
    elif version is None:
        version, raw = shardlists.read(node_id)
        if version is not None:
            cached = from_cache(node_id, version, raw, reports)
            if cached is not None:
                return cached
    rows = _node_shards.run(node_id)
    shards = [s for s in rows if s.state != ReplicaState.FAILED]
    effects = read_reports(node_id, shards, reports) if reports is not None else None
    gone = apply_reports(effects) if effects else set()
    result, held = _built(rows, gone)
    # After writing, the version has moved: the next heartbeat reads again. A hold ends with no
    # change of version (the gateways' requests finish), so while one lasts nothing is cached.
    if version is not None and not effects and not held:
        entry = _cache_entry(version, shards, result)
        if defer_cache:
            return result._replace(to_cache=entry)
        shardlists.store(node_id, entry)
    return result


def _built(rows: list[Shard], gone: set[str]) -> tuple[Orders, set[str]]:
    """The orders a node's shard rows give, those in `gone` left out; and the shards held for a drain."""
    shards = [s for s in rows if s.state != ReplicaState.FAILED]
    # A failed replica's shards (kept an hour) still ask for their engine, so a failed install
    # goes on being retried by the agent with its backoff instead of being forgotten, then
    # asked for afresh by the next placement on this node: a retry loop without the backoff.
    recently_failed = [s for s in rows if s.state == ReplicaState.FAILED]
    # A leaving replica's engine runs on while gateways have requests on it (inventory.drainhold).
    held = drainhold.held(s for s in shards if s.shard_id not in gone)
    wanted = [s for s in shards if (s.state in RUN_STATES or s.shard_id in held) and s.shard_id not in gone]
    leaders = _leaders([s.replica for s in wanted if s.replica.deployment.shards_per_replica > 1])
    specs = [shard_spec(s, leaders.get(s.replica_id, "")) for s in wanted]
    # Placing a shard is what asks for its engine: the agent installs it, then starts the shard.
    return Orders(specs, engine_wants.wants([*wanted, *recently_failed])), held


def cache_entries(node_ids: Sequence[str], versions: Sequence[tuple[int, int]]) -> dict[str, CachedShards]:
    """The shard lists of these nodes as their heartbeats would cache them, each under its version
    (livestate.shardlists.keep); a node with a shard held for a drain is left out, as `orders` leaves it.

    Every shard is read in one query, without a list of ids: the ids' parameters cost more
    than the rows (nodes.api.cards.all_from_database). A node without shards, most of a
    fleet between placements, gets the empty list without building it.
    """
    rows: dict[str, list[Shard]] = {node_id: [] for node_id in node_ids}
    for shard in _every_nodes_shards():
        if (found := rows.get(shard.node_id)) is not None:
            found.append(shard)
    no_shards, _ = _built([], set())
    entries = {}
    for (node_id, found), version in zip(rows.items(), versions, strict=True):
        if not found:
            entries[node_id] = _cache_entry(version, [], no_shards)
            continue
        result, held = _built(found, set())
        if not held:
            entries[node_id] = _cache_entry(version, [s for s in found if s.state != ReplicaState.FAILED], result)
    return entries


def keep_cached() -> int | None:
    """Store every node's shard list afresh when due (livestate.shardlists.keep); how many, or None."""
    return shardlists.keep(lambda: list(Node.objects.order_by().values_list("pk", flat=True)), cache_entries)


# The states of the shards a node's orders are built from.
ORDERED_STATES = (*RUN_STATES, ReplicaState.RELEASING, ReplicaState.FAILED)
# A node's shards that its orders are built from, with their replicas and deployments. Compiled
# once per process: compiling it was two thirds of a heartbeat whose shard list was not cached.
_node_shards = CompiledQuery(
    lambda node_id: (
        Shard.objects.filter(node_id=node_id, state__in=ORDERED_STATES)
        .select_related("replica__deployment")
        .order_by("shard_id")
    )
)


def _every_nodes_shards() -> Iterator[Shard]:
    """Every node's shards that orders are built from, as `_node_shards` reads one node's."""
    return (
        Shard.objects.filter(state__in=ORDERED_STATES)
        .select_related("replica__deployment")
        .order_by("node_id", "shard_id")
        .iterator(chunk_size=2000)
    )


def _cache_entry(version: tuple[int, int], shards: list[Shard], result: Orders) -> CachedShards:
    facts = [
        ShardFacts(s.shard_id, s.state, s.reason, s.metrics_port, ReplicaName(s.replica.replica_id)) for s in shards
    ]
    return CachedShards(version, facts, result.shards, result.engines)


def _leaders(replicas) -> dict[int, str]:
    """Where the other shards of each multi-node replica join it: shard 0's node's trusted address and port.

    A replica whose shard 0 has no trusted address has no leader (inventory/endpoints.py): its
    other shards are never told to connect where that node merely claims to be.
    """
    if not replicas:
        return {}
    rows = Shard.objects.filter(replica__in=replicas, index=0).values_list(
        "replica_id", "node__mgmt_addr", "node__source_addr", "port"
    )
    leaders = {}
    for replica, claimed, source, port in rows:
        if (host := endpoints.trusted_address(claimed, source)) is not None:
            leaders[replica] = f"{host}:{port}"
    return leaders


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
    env[enginekinds.API_KEY_ENV] = deployment.engine_secret
    if settings.LLMGW_ENGINE_SCRAPE_KEY:
        env[enginekinds.SCRAPE_KEY_ENV] = settings.LLMGW_ENGINE_SCRAPE_KEY
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


def launch(deployment: Deployment, shard: Shard, leader: str = "") -> enginekinds.Launch:
    """What a shard's command depends on, read from its deployment's profile and its placement."""
    return enginekinds.Launch(
        model=deployment.model_source,
        port=shard.port,
        threads=deployment.cpu_cores_per_shard,
        gpus=deployment.gpus_per_shard,
        shards=deployment.shards_per_replica,
        shard_index=shard.index,
        leader=leader,
        served_name=deployment.served_model_name,
        extra=tuple(deployment.argv()),
    )


def command(deployment: Deployment, shard: Shard, leader: str = "") -> list[str]:
    """The engine's command line for one shard, from the kind's record the agent uses too (agent/enginekinds/)."""
    return enginekinds.command_line(deployment.engine, launch(deployment, shard, leader))
