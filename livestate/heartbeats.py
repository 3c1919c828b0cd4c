"""Heartbeat times of live nodes, held in one Redis hash until the sweep writes them to the database.

An ordinary heartbeat of a live node writes no database row: its arrival time
goes into the hash (the beat script, or `record`'s script), and `inventory.liveness`
takes the whole hash (`take`) and writes it to `Node.last_heartbeat` in bulk.
"""

from __future__ import annotations

from pathlib import Path
from typing import NamedTuple

import livestate
from livestate import cards, keys, loadstore, selfmetrics, shardlists
from livestate.cards import NodeCard
from livestate.ownscript import OwnScript
from livestate.shardlists import CachedShards

_record = OwnScript((Path(__file__).parent / "recordscript.lua").read_text())


class RecordKeys(NamedTuple):
    """The record script's KEYS, in its order."""

    heartbeats_key: str
    load_key: str
    load_lines_key: str
    card_key: str
    node_shards_key: str
    self_metrics_key: str


class RecordArgs(NamedTuple):
    """The record script's ARGV, in its order; the self-metrics' increments follow."""

    node_id: str
    received_at: str
    load: bytes
    load_lines: bytes
    load_expiry: int
    card: bytes
    card_expiry: int
    shards: bytes
    shards_expiry: int
    increments: int


def record(
    node_id: str,
    received_at: float,
    load: loadstore.RenderedLoad | None,
    card: NodeCard | None,
    counts: dict[str, float],
    shards: CachedShards | None = None,
) -> None:
    """Write a heartbeat the beat script did not apply, in one script call (raises redis errors).

    Its time, its load (if it carried one, as the beat script's caller rendered
    it), the node's card (when it was read from the database or changed), its
    shard list (when read from the database) and the heartbeat's self-metrics.
    A whole fleet takes this path at once after Redis lost its data: sent as one
    command packed by hiredis (livestate.ownscript), it costs the web worker a
    fraction of the redis-py pipeline of up to ten commands it replaced.
    """
    node = keys.of_node(node_id)
    script_keys = RecordKeys(
        heartbeats_key=keys.HEARTBEATS,
        load_key=node.load,
        load_lines_key=node.load_lines,
        card_key=node.card,
        node_shards_key=node.node_shards,
        self_metrics_key=keys.SELF_METRICS,
    )
    increments = selfmetrics.as_script_args(counts)
    args = RecordArgs(
        node_id=node_id,
        received_at=repr(received_at),
        load=load.encoded if load else b"",
        load_lines=load.lines if load else b"",
        load_expiry=loadstore.expiry_seconds(),
        card=cards.encode(card) if card is not None else b"",
        card_expiry=cards.expiry(),
        shards=shardlists.encode(shards) if shards is not None else b"",
        shards_expiry=shardlists.expiry(),
        increments=len(increments) // 3,
    )
    _record(script_keys, [*args, *increments])


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
