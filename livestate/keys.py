"""Every Redis key and key prefix the control plane uses, and how node ids and names join them.

Defined here once so that a reader sees the whole keyspace, and no two modules
can drift apart on a key they share (the beat script reads keys that five other
modules write).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import lru_cache
from typing import NamedTuple

# A node's latest load with its arrival time, msgpack (livestate.loadstore); expires.
LOAD_PREFIX = "llmgw:load:"
# The same load rendered as /metrics sample lines (livestate.loadlines); expires with it.
LOAD_LINES_PREFIX = "llmgw:loadlines:"
# What the heartbeat path knows of a node (livestate.cards), msgpack; expires.
CARD_PREFIX = "llmgw:nodecard:"
# Set while the cards stored afresh by the last keeping are young (livestate.keeping): expires with its period,
# and goes with the rest when Redis loses its data, which is what tells the next keeping to run.
CARDS_KEPT = "llmgw:nodecards-kept"
# Set by every keeping of the cards, without expiry: absent once Redis has lost its data (or before the first
# keeping), which a heartbeat finding no current card reads as the sign to refill at once (inventory.refill).
CARDS_FILLED = "llmgw:nodecards-filled"
# A node's card generation: bumped by every change a card holds (livestate.cards).
GENERATION_PREFIX = "llmgw:nodegen:"
# Hash: node id → arrival time of its latest heartbeat not yet in the database (livestate.heartbeats).
HEARTBEATS = "llmgw:liveness:heartbeats"
# Arrival time (Unix s) of the latest heartbeat accepted by any process, written at most once a second each
# (livestate.sweeprecord): silence of the whole fleet there means the control plane was not listening.
ACCEPTED_AT = "llmgw:liveness:accepted-at"
# "<arrival> <seconds waited>" of the latest heartbeat that waited longer than LLMGW_BEHIND_AFTER in the proxy
# for a web worker, written at most once a second by each process (livestate.sweeprecord): the control plane
# is behind on its heartbeats.
BEHIND_AT = "llmgw:liveness:behind-at"
# Hash: the stale sweep's own record (last run, grace period, quiet), kept by each sweep (livestate.sweeprecord).
SWEEP_RECORD = "llmgw:liveness:sweep-record"
# Lock held by the stale sweep running now (livestate.locks); expires if its worker dies.
SWEEP_LOCK = "llmgw:liveness:sweep-lock"
# Hash: node id (or "*" for every node) → counter moved when its shards may change (livestate.shardversion).
SHARD_VERSIONS = "llmgw:shards:versions"
# A node's shard list cached under the shard versions it was read at (livestate.shardlists); expires.
NODE_SHARDS_PREFIX = "llmgw:nodeshards:"
# Set while the shard lists stored afresh by the last keeping are young (livestate.keeping), as CARDS_KEPT.
SHARD_LISTS_KEPT = "llmgw:nodeshards-kept"
# Hash of a node's latest heartbeat: its agent run's boot id and number in that run (livestate.sequence); expires.
SEQUENCE_PREFIX = "llmgw:nodeseq:"
# Fixed-minute counters of the agent API limits, `<prefix><name>:<minute>` (livestate.limits); expire.
LIMIT_PREFIX = "llmgw:limit:"
# Hash: the control plane's own counters and the proxy clocks' offsets, shared by every process (livestate.selfmetrics).
SELF_METRICS = "llmgw:selfmetrics"
# Lock held by the reconcile pass running now (livestate.locks); expires if its worker dies.
RECONCILE_LOCK = "llmgw:reconcile"
# The cluster page's fleet totals and the node table's sort figures, shared by every web worker
# for a few seconds (nodes/fleetload.py).
FLEET_TOTALS = "llmgw:pages:fleet-totals"
# Hash: gateway instance → JSON of its servers' requests in flight by replica id, with when it was
# reported (livestate.inflight): written by each gateway's sync every second, read to hold a drain.
GATEWAY_IN_FLIGHT = "llmgw:gateway:in-flight"
# One key per sort figure under this prefix (`fleet_sort_figures`).
FLEET_SORT_FIGURES = "llmgw:pages:fleet-sort-figures"
# The fleet's part of /metrics, rendered ahead by Celery beat (nodes/metrics/prerender.py).
METRICS_FLEET = "llmgw:metrics:fleet"


def _node_key(prefix: str) -> Callable[[str], str]:
    """The function naming one node's key under `prefix`."""

    def key(node_id: str) -> str:
        return prefix + node_id

    return key


load = _node_key(LOAD_PREFIX)
load_lines = _node_key(LOAD_LINES_PREFIX)
card = _node_key(CARD_PREFIX)
generation = _node_key(GENERATION_PREFIX)
node_shards = _node_key(NODE_SHARDS_PREFIX)
sequence = _node_key(SEQUENCE_PREFIX)


class NodeKeys(NamedTuple):
    """A node's own keys, as the beat script needs them."""

    card: str
    generation: str
    load: str
    load_lines: str
    node_shards: str
    sequence: str


# Built once per node: a heartbeat would otherwise join the same strings
# every time. Bounded, since the node id comes from a token not yet checked.
@lru_cache(maxsize=1 << 15)
def of_node(node_id: str) -> NodeKeys:
    return NodeKeys(
        card=card(node_id),
        generation=generation(node_id),
        load=load(node_id),
        load_lines=load_lines(node_id),
        node_shards=node_shards(node_id),
        sequence=sequence(node_id),
    )


# The names of the limit counters; `limit()` adds the minute.
def refused_tokens(address: str) -> str:
    """Credentials refused to this address."""
    return f"fail:{address}"


def registrations(address: str) -> str:
    """Registrations from this address."""
    return f"register:{address}"


def token_heartbeats(token_digest: str) -> str:
    """Heartbeats sent with the token of this digest (never the token itself)."""
    return f"heartbeat:{token_digest}"


def limit(name: str, minute: int) -> str:
    """The counter of `name` for the minute numbered `minute` since the epoch."""
    return f"{LIMIT_PREFIX}{name}:{minute}"


def fleet_sort_figures(figure: str) -> str:
    """The fleet's node ids in the order of one sort figure ("cpu", "ram", "load")."""
    return f"{FLEET_SORT_FIGURES}:{figure}"
