"""The ordinary heartbeat in one Redis round trip: one script admits it, applies it and reads what the reply needs.

At 2,000 heartbeats a second, each Redis round trip costs the web workers more
CPU than the rest of the heartbeat, so `beatscript.lua` does in one call what
took five: refuse an address that has guessed too many tokens, count the
token's heartbeats against its limit, read the node's card and check the
secret against it (in constant time), and, for a live node sending no
inventory, note the heartbeat's time, store its load and read the node's shard
version and cached shard list.

Whatever it cannot settle it hands back without writing anything: a card that
is missing or stale (`stale`: the caller reads the database), a node coming
back to life or a new inventory (`card`: the caller writes the database). Its
counters use the same keys as `nodes.ratelimit`, so its limits are those of
the rest of the agent API.

Each process sends the script on a connection of its own rather than through
redis-py's client, whose pool, retries and hooks cost the call about as much
CPU again as the send and the answer themselves.
"""

from __future__ import annotations

import hashlib
import os
import secrets
from dataclasses import dataclass
from pathlib import Path

import redis
from django.conf import settings

from inventory import desired, liveness, shardversion
from nodes import loadstore, ratelimit
from nodes.api import cards
from nodes.api.cards import NodeCard

SOURCE = (Path(__file__).parent / "beatscript.lua").read_text()
SHA = hashlib.sha1(SOURCE.encode()).hexdigest()

LOCKED = "locked"
RATE = "rate"
STALE = "stale"
UNAUTHORIZED = "unauthorized"
CARD = "card"
APPLIED = "applied"


@dataclass
class Verdict:
    outcome: str
    card: NodeCard | None = None
    generation: int = 0
    # Only when applied: the node's shard version and its cached shard list, if any.
    shard_version: tuple[int, int] | None = None
    cached_shards: bytes | None = None


class _Connection:
    """This process's own connection for the script, made again when the client or the process changes."""

    def __init__(self):
        self.client = None
        self.pid = 0
        self.connection = None

    def call(self, keys: list, args: list):
        connection = self._current()
        try:
            try:
                return self._send(connection, "EVALSHA", SHA, keys, args)
            except redis.exceptions.NoScriptError:
                # A restarted Redis has forgotten the script: EVAL loads it again.
                return self._send(connection, "EVAL", SOURCE, keys, args)
        except (redis.ConnectionError, redis.TimeoutError):
            # The next call connects afresh; this one is answered from the database.
            connection.disconnect()
            raise

    @staticmethod
    def _send(connection, command: str, script: str, keys: list, args: list):
        connection.send_packed_command(connection.pack_command(command, script, len(keys), *keys, *args), False)
        return connection.read_response()

    def _current(self):
        client = loadstore.client()
        if self.connection is None or self.client is not client or self.pid != os.getpid():
            if self.connection is not None and self.pid == os.getpid():
                self.connection.disconnect()
            self.client, self.pid = client, os.getpid()
            self.connection = client.connection_pool.make_connection()
        return self.connection


_connection = _Connection()


def token_digest(token: str) -> str:
    """The name a token's heartbeat counter goes by: never the token itself."""
    return hashlib.sha256(token.encode()).hexdigest()[:32]


def run(
    node_id: str,
    secret: str,
    token: str,
    address: str,
    now: float,
    apply: bool,
    load: loadstore.RenderedLoad | None = None,
) -> Verdict:
    """Admit a heartbeat of `node_id` and, with `apply`, apply it if it is ordinary (raises redis errors)."""
    fail_key = ratelimit.window_key(f"fail:{address}", now)
    rate_key = ratelimit.window_key(f"heartbeat:{token_digest(token)}", now)
    keys = [
        fail_key,
        rate_key,
        cards.card_key(node_id),
        cards.generation_key(node_id),
        liveness.HEARTBEATS_KEY,
        loadstore.key(node_id),
        loadstore.lines_key(node_id),
        shardversion.KEY,
        desired.cache_key(node_id),
    ]
    args = [
        settings.LLMGW_AUTH_FAILURES_PER_MINUTE,
        settings.LLMGW_HEARTBEAT_PER_MINUTE,
        ratelimit.WINDOW + 1,
        hashlib.sha256(secret.encode()).hexdigest(),
        node_id,
        repr(now),
        "apply" if apply else "check",
        load.encoded if load else b"",
        load.lines if load else b"",
        loadstore.expiry_seconds(),
        secrets.token_hex(8),
    ]
    answer = _connection.call(keys, args)
    outcome = answer[0].decode()
    if outcome == STALE:
        return Verdict(outcome, generation=int(answer[1]))
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
