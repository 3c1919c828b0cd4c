"""Heartbeat times of live nodes, held in one Redis hash until the sweep writes them to the database.

An ordinary heartbeat of a live node writes no database row: its arrival time
goes into the hash (the beat script, or `record`), and `inventory.liveness`
takes the whole hash (`take`) and writes it to `Node.last_heartbeat` in bulk.
"""

from __future__ import annotations

from redis.client import Pipeline

import livestate
from agent.protocol import Load
from livestate import cards, keys, loadstore, selfmetrics, shardlists
from livestate.cards import NodeCard
from livestate.shardlists import CachedShards


def record(
    node_id: str,
    received_at: float,
    load: Load | None,
    card: NodeCard | None,
    counts: dict[str, float],
    shards: CachedShards | None = None,
) -> None:
    """Write a heartbeat the beat script did not apply, in one round trip (raises redis errors).

    Its time, its load (if it carried one), the node's card (when it was read
    from the database or changed), its shard list (when read from the database)
    and the heartbeat's self-metrics.
    """
    pipe = livestate.client().pipeline(transaction=False)
    note(pipe, node_id, received_at)
    if load is not None:
        loadstore.save(node_id, load, received_at, pipe)
    if card is not None:
        cards.store(pipe, card)
    if shards is not None:
        shardlists.queue_store(pipe, node_id, shards)
    selfmetrics.add(pipe, counts)
    pipe.execute()


def note(pipe: Pipeline, node_id: str, received_at: float) -> None:
    """Queue a live node's heartbeat time (Unix seconds, the control plane's clock) on a pipeline."""
    pipe.hset(keys.HEARTBEATS, node_id, repr(received_at))


def take() -> dict[bytes, bytes]:
    """Every held time (node id → time), emptying the hash (raises redis errors).

    Read and emptied in one transaction, so a heartbeat arriving meanwhile lands
    in a fresh hash for the next taker.
    """
    pipe = livestate.client().pipeline(transaction=True)
    pipe.hgetall(keys.HEARTBEATS)
    pipe.delete(keys.HEARTBEATS)
    raw: dict[bytes, bytes] = pipe.execute()[0]  # HGETALL's reply
    return raw


def put_back(raw: dict[bytes, bytes]) -> None:
    """Return taken times that could not be stored, unless a newer one has arrived since."""
    pipe = livestate.client().pipeline(transaction=False)
    for node_id, value in raw.items():
        pipe.hsetnx(keys.HEARTBEATS, node_id, value)
    pipe.execute()
