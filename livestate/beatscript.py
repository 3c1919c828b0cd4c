"""The ordinary heartbeat in one Redis round trip: one script admits it, applies it and reads what the reply needs.

At 2,000 heartbeats a second, each Redis round trip costs the web workers more
CPU than the rest of the heartbeat, so `beatscript.lua` does in one call what
took five: count the token's heartbeats against its limit, read the node's
card and check the secret against it (in constant time; a wrong one is
counted against the address, which past its budget hears `locked`), refuse a
heartbeat older than one already received from the same agent run
(`replayed`, livestate.sequence) and record a newer one's number, and, for a
live node sending no inventory, note the heartbeat's time, store its load and
read the node's shard version and cached shard list. That includes an
unreachable or lost node: its noted time is all it takes to bring it back,
since the sweep's flush revives every node it finds there in bulk
(inventory.liveness); the caller answers it as alive at once.

Whatever it cannot settle it hands back without writing anything: a card that
is missing or stale (`stale`: the caller reads the database; the node's shard
version and cached list come with it, read for after the token is proven, and
whether the cards have been filled since Redis last lost its data), or a new
inventory (`card`: the caller writes the database). Its
counters use the same keys as `livestate.limits`, so its limits are those of
the rest of the agent API.

The script's KEYS and ARGV are built by name (`BeatKeys`, `BeatArgs`): each
field's position is its position in the script, where the same names are
assigned from KEYS[n] and ARGV[n] at the top (tests/test_beatscript.py
compares the two).

Each process sends the script on a connection of its own, packed by hiredis
(livestate.ownscript), rather than through redis-py's client, whose pool,
retries and hooks cost the call about as much CPU again as the send and the
answer themselves.
"""

from __future__ import annotations

import hashlib
import secrets
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

from django.conf import settings

from livestate import cards, keys, limits, loadstore, sequence, shardversion
from livestate.cards import NodeCard
from livestate.ownscript import OwnScript

SOURCE = (Path(__file__).parent / "beatscript.lua").read_text()

LOCKED = "locked"
RATE = "rate"
STALE = "stale"
UNAUTHORIZED = "unauthorized"
CARD = "card"
APPLIED = "applied"
REPLAYED = "replayed"


@dataclass
class Verdict:
    outcome: str
    card: NodeCard | None = None
    generation: int = 0
    # Only when applied or stale: the node's shard version and its cached shard list, if any.
    shard_version: tuple[int, int] | None = None
    cached_shards: bytes | None = None
    # Only when replayed: the number of the newest heartbeat of the run.
    newest_seq: int = 0
    # Only when stale: no keeping has filled the cards since Redis lost its data (inventory.refill).
    cards_lost: bool = False


_script = OwnScript(SOURCE)


def token_digest(token: str) -> str:
    """The name a token's heartbeat counter goes by: never the token itself."""
    return hashlib.sha256(token.encode()).hexdigest()[:32]


class BeatKeys(NamedTuple):
    """The script's KEYS, in its order."""

    refused_key: str
    rate_key: str
    card_key: str
    generation_key: str
    heartbeats_key: str
    load_key: str
    load_lines_key: str
    shard_versions_key: str
    node_shards_key: str
    sequence_key: str
    cards_filled_key: str


class BeatArgs(NamedTuple):
    """The script's ARGV, in its order."""

    refused_allowed: int
    heartbeats_allowed: int
    counter_expiry: int
    secret_digest: str
    node_id: str
    received_at: str
    mode: str
    load: bytes
    load_lines: bytes
    load_expiry: int
    salt: str
    boot_id: str
    seq: int
    sequence_expiry: int


def run(
    node_id: str,
    secret: str,
    token: str,
    address: str,
    now: float,
    apply: bool,
    load: loadstore.RenderedLoad | None = None,
    boot_id: str = "",
    seq: int = 0,
) -> Verdict:
    """Admit a heartbeat of `node_id` and, with `apply`, apply it if it is ordinary (raises redis errors).

    A heartbeat with a `boot_id` no newer than the node's newest is `replayed`,
    before anything is written (livestate.sequence).
    """
    node = keys.of_node(node_id)
    minute = limits.minute(now)
    script_keys = BeatKeys(
        refused_key=keys.limit(keys.refused_tokens(address), minute),
        rate_key=keys.limit(keys.token_heartbeats(token_digest(token)), minute),
        card_key=node.card,
        generation_key=node.generation,
        heartbeats_key=keys.HEARTBEATS,
        load_key=node.load,
        load_lines_key=node.load_lines,
        shard_versions_key=keys.SHARD_VERSIONS,
        node_shards_key=node.node_shards,
        sequence_key=node.sequence,
        cards_filled_key=keys.CARDS_FILLED,
    )
    args = BeatArgs(
        refused_allowed=settings.LLMGW_AUTH_FAILURES_PER_MINUTE,
        heartbeats_allowed=settings.LLMGW_HEARTBEAT_PER_MINUTE,
        counter_expiry=limits.WINDOW + 1,
        secret_digest=hashlib.sha256(secret.encode()).hexdigest(),
        node_id=node_id,
        received_at=repr(now),
        mode="apply" if apply else "check",
        load=load.encoded if load else b"",
        load_lines=load.lines if load else b"",
        load_expiry=loadstore.expiry_seconds(),
        salt=secrets.token_hex(8),
        boot_id=boot_id,
        seq=seq,
        sequence_expiry=sequence.KEEP_SECONDS,
    )
    answer = _script(script_keys, args)
    outcome = answer[0].decode()
    if outcome == STALE:
        return Verdict(
            outcome,
            generation=int(answer[1]),
            shard_version=shardversion.parse(answer[2:4]),
            cached_shards=answer[4],
            cards_lost=not answer[5],
        )
    if outcome == REPLAYED:
        return Verdict(outcome, newest_seq=int(answer[1]))
    if outcome == CARD:
        return Verdict(outcome, card=cards.decode(answer[1]))
    if outcome == APPLIED:
        return Verdict(
            outcome,
            card=cards.decode(answer[1]),
            shard_version=shardversion.parse(answer[2:4]),
            cached_shards=answer[4],
        )
    return Verdict(outcome)
