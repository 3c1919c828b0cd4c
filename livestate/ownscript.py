"""Lua scripts sent on this process's own Redis connection, packed by hiredis: the heartbeat's cheap route.

At 2,000 heartbeats a second every Redis call on the heartbeat's path costs
the web workers CPU, and redis-py spends more of it than the call itself: its
pool, retries and hooks, and its `pack_command`, which walks every argument in
Python looking for bytearrays. So the heartbeat's scripts (the beat script,
livestate/beatscript.py; the writes of a heartbeat it could not apply,
livestate/heartbeats.py; the sequence check of a card read from the database,
livestate/sequence.py) are sent here instead: one command packed by hiredis in
C, sent by digest (EVALSHA, and EVAL once when a restarted Redis has forgotten
the script), its one answer read back.

The connection is this process's own, made from the shared client's pool and
made again when the client (tests point it elsewhere) or the process (a fork)
changes; a web worker runs one request at a time (devstack.stack,
`--blocking-threads 1`). A connection that failed is dropped, so the next call
connects afresh, and the failure is raised as redis-py's error to the caller.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Sequence
from typing import Any

import hiredis
import redis
from redis.connection import ConnectionInterface

import livestate

# What a script's KEYS and ARGV may hold: what hiredis packs.
Part = str | bytes | int | float


class OwnScript:
    """A Lua script and its digest, run on this process's own connection."""

    def __init__(self, source: str):
        self.source = source
        self.sha = hashlib.sha1(source.encode()).hexdigest()

    def __call__(self, keys: Sequence[Part], args: Sequence[Part]) -> Any:
        """The script's answer as redis-py reads it (raises redis errors)."""
        return _connection.call(self, keys, args)


class _Connection:
    def __init__(self) -> None:
        self.client: redis.Redis | None = None
        self.pid = 0
        self.connection: ConnectionInterface | None = None

    def call(self, script: OwnScript, keys: Sequence[Part], args: Sequence[Part]) -> Any:
        connection = self._current()
        try:
            try:
                return self._send(connection, "EVALSHA", script.sha, keys, args)
            except redis.exceptions.NoScriptError:
                # A restarted Redis has forgotten the script: EVAL loads it again.
                return self._send(connection, "EVAL", script.source, keys, args)
        except (redis.ConnectionError, redis.TimeoutError):
            # The next call connects afresh; this one's caller falls back (the database, or nothing).
            connection.disconnect()
            raise

    @staticmethod
    def _send(
        connection: ConnectionInterface, command: str, script: str, keys: Sequence[Part], args: Sequence[Part]
    ) -> Any:
        # hiredis's stub types the command as a one-item tuple; it takes any number of parts.
        packed = hiredis.pack_command((command, script, len(keys), *keys, *args))  # type: ignore[arg-type]
        connection.send_packed_command([packed], False)
        return connection.read_response()

    def _current(self) -> ConnectionInterface:
        client = livestate.client()
        connection = self.connection
        if connection is None or self.client is not client or self.pid != os.getpid():
            if connection is not None and self.pid == os.getpid():
                connection.disconnect()
            self.client, self.pid = client, os.getpid()
            connection = self.connection = client.connection_pool.make_connection()
        return connection


_connection = _Connection()
