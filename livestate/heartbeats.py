"""Heartbeat times of live nodes, held in one Redis hash until the sweep writes them to the database.

An ordinary heartbeat of a live node writes no database row: its arrival time
goes into the hash (`note`, or the beat script), and `inventory.liveness`
takes the whole hash (`take`) and writes it to `Node.last_heartbeat` in bulk.
"""

from __future__ import annotations

import livestate
from livestate import keys


def note(pipe, node_id: str, received_at: float) -> None:
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
    raw, _ = pipe.execute()
    return raw


def put_back(raw: dict[bytes, bytes]) -> None:
    """Return taken times that could not be stored, unless a newer one has arrived since."""
    pipe = livestate.client().pipeline(transaction=False)
    for node_id, value in raw.items():
        pipe.hsetnx(keys.HEARTBEATS, node_id, value)
    pipe.execute()
