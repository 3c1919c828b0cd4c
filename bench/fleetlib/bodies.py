"""What a node running 2 to 4 engines sends, built from agent.protocol types as the agent builds it.

The inventories are the soak's machine classes (bench/soaklib/fleet.py). The
engines are named after the node and are not placed by the control plane: the
heartbeat path reads their reports against the node's cached shard list either
way, so the cost per beat is that of a node whose engines are all known.
"""

from __future__ import annotations

import random
import time

from agent import protocol
from agent.discovery import inventory_hash
from bench.soaklib.fleet import make_inventory

GiB = 2**30


def node_id(index: int) -> str:
    return f"node-{index:05d}"


def registration(index: int, rng: random.Random) -> tuple[protocol.Register, str]:
    """The node's registration and its inventory hash."""
    inventory = make_inventory(node_id(index), rng)
    digest = inventory_hash(inventory)
    return protocol.Register(node_id=node_id(index), inventory=inventory, inventory_hash=digest), digest


def heartbeat(index: int, digest: str, cpus: int, memory: int, rng: random.Random) -> bytes:
    """An unchanged-inventory heartbeat: the node's load and the loads and statuses of 2–4 engines."""
    engines = [f"{node_id(index)}-e{e}" for e in range(rng.randint(2, 4))]
    busy = rng.uniform(5, 95)
    used = int(memory * rng.uniform(0.2, 0.9))
    beat = protocol.Heartbeat(
        inventory_hash=digest,
        load=protocol.Load(
            cpu_percent=round(busy, 2),
            cpus=cpus,
            load1=round(cpus * busy / 100, 2),
            load5=round(cpus * busy / 110, 2),
            load15=round(cpus * busy / 120, 2),
            memory_used_bytes=used,
            memory_available_bytes=memory - used,
            interval_seconds=5.0,
            shards=[
                protocol.ShardLoad(
                    shard=e, cpu_cores=round(rng.uniform(0.5, 16), 2), rss_bytes=rng.randint(4, 64) * GiB
                )
                for e in engines
            ],
        ),
        shards=[
            protocol.ShardStatus(shard=e, state="running", pid=20000 + i, metrics_port=8100 + i)
            for i, e in enumerate(engines)
        ],
        sent_at=time.time(),
    )
    return protocol.encode(beat)
