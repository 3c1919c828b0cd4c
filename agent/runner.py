"""Engines as process groups: start what is wanted, stop what is not, restart what dies.

Everything goes through `reconcile(specs)`: the config's shards become specs like the
ones the control plane sends, so there is one way a shard starts. Each shard runs in
a new session, so its process group id is its leader's pid and one signal reaches
every process it forked. Nothing here blocks: `poll()` is called on every tick to
notice exits, escalate stops to SIGKILL and start what is due.
"""

from __future__ import annotations

import contextlib
import errno
import http.client
import logging
import os
import shutil
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from agent import cgroups, enginekinds, leftovers, protocol
from agent.details import with_last_lines

log = logging.getLogger("agent.runner")

MAX_LOG_BYTES = 64 * 2**20


@dataclass
class Shard:
    spec: protocol.ShardSpec
    state: protocol.ShardState = "starting"
    process: subprocess.Popen[bytes] | None = None
    restarts: int = 0
    exit_code: int | None = None
    detail: str = ""
    started_at: float = 0.0
    next_start: float = 0.0
    leader_start: int | None = None  # the leader's start time in ticks since boot, for leftovers
    backoff: float = 0.0
    # While stopping: when SIGKILL follows, and what happens once the group is gone.
    kill_at: float | None = None
    then: protocol.ShardSpec | None = None
    remove: bool = False
    placement: cgroups.Placement | None = None  # the engine's own cgroup, where the host allows one


class Runner:
    def __init__(
        self,
        log_dir: Path,
        env: dict[str, str] | None = None,
        grace: float = 10.0,
        backoff_base: float = 1.0,
        backoff_cap: float = 60.0,
        stable_after: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
        record_file: Path | None = None,
        cgroups: cgroups.Cgroups | None = None,
        key_dir: Path | None = None,
    ):
        self.log_dir = Path(log_dir)
        # Where an engine that reads its API key from a file (`EngineKind.api_key_file`) finds it.
        self.key_dir = Path(key_dir) if key_dir is not None else self.log_dir.parent / "keys"
        # Where each engine gets a cgroup of its own; None runs engines where the agent runs.
        self.cgroups = cgroups
        # Where live groups are recorded for the next agent (agent/leftovers.py); None records nothing.
        self.record_file = record_file
        self._recorded: dict[str, tuple[int, int]] = {}
        self.env = {**os.environ, **(env or {})}
        self.grace = grace
        self.backoff_base = backoff_base
        self.backoff_cap = backoff_cap
        self.stable_after = stable_after
        self.clock = clock
        self.shards: dict[str, Shard] = {}
        self.closed = False
        self.lock = threading.RLock()

    # -- what the agent asks -------------------------------------------------------------------

    def reconcile(self, desired: list[protocol.ShardSpec]) -> None:
        """Make the running set exactly `desired`: start new shards, stop others, restart changed ones."""
        wanted = {spec.shard: spec for spec in desired}
        with self.lock:
            if self.closed:
                # A heartbeat reply that lands while the agent stops must not start anything again.
                return
            for shard_id, shard in list(self.shards.items()):
                if shard_id not in wanted:
                    shard.then, shard.remove = None, True
                    self._stop(shard)
            for shard_id, spec in wanted.items():
                known = self.shards.get(shard_id)
                if known is None:
                    self.shards[shard_id] = known = Shard(spec)
                    self._start(known)
                elif known.spec != spec or known.remove:
                    known.remove = False
                    if known.process is not None and known.process.poll() is None:
                        known.then = spec
                        self._stop(known)
                    else:
                        known.spec, known.then = spec, None
                        known.restarts, known.backoff, known.exit_code = 0, 0.0, None
                        self._start(known)
            self._record()

    def poll(self) -> None:
        """Notice exits, escalate overdue stops, start what is due. Cheap; call it every tick."""
        now = self.clock()
        with self.lock:
            for shard_id, shard in list(self.shards.items()):
                process = shard.process
                alive = process is not None and process.poll() is None
                if shard.kill_at is not None:
                    if process is not None and alive and now >= shard.kill_at:
                        log.warning("shard %s did not stop within %g s; killing its group", shard_id, self.grace)
                        leftovers.signal_group(process.pid, signal.SIGKILL)
                        shard.kill_at = now + self.grace
                    elif not alive:
                        self._stopped(shard_id, shard)
                elif shard.state in ("starting", "restarting", "running") and not alive:
                    self._exited(shard, now)
                elif shard.state in ("starting", "restarting") and _ready(shard):
                    shard.state = "running"
                elif shard.state == "running" and shard.backoff and now - shard.started_at >= self.stable_after:
                    shard.backoff = 0.0
                elif shard.state in ("exited", "failed") and now >= shard.next_start:
                    shard.restarts += 1
                    self._start(shard, restarting=True)
            self._record()

    def statuses(self) -> list[protocol.ShardStatus]:
        with self.lock:
            return [
                protocol.ShardStatus(
                    shard=shard_id,
                    state=shard.state,
                    pid=shard.process.pid if shard.process is not None and shard.state != "stopped" else 0,
                    exit_code=None if shard.exit_code is None else max(-255, min(255, shard.exit_code)),
                    metrics_port=shard.spec.port,
                    restarts=min(shard.restarts, 1_000_000),
                    detail=shard.detail[: protocol.MAX_DETAIL],
                )
                for shard_id, shard in sorted(self.shards.items())
            ]

    def process_groups(self) -> dict[str, int]:
        """Running shards and their process group ids (the leader's pid, as each has its own session)."""
        with self.lock:
            return {
                shard_id: shard.process.pid
                for shard_id, shard in self.shards.items()
                if shard.process is not None and shard.state in ("starting", "restarting", "running")
            }

    def placements(self) -> dict[str, cgroups.Placement]:
        """The cgroup of each running shard that has one."""
        with self.lock:
            return {
                shard_id: shard.placement
                for shard_id, shard in self.shards.items()
                if shard.placement is not None and shard.state in ("starting", "restarting", "running")
            }

    def stop_all(self, grace: float | None = None) -> None:
        """SIGTERM every group, SIGKILL what is left after the grace period, wait for them all; start nothing after."""
        grace = self.grace if grace is None else grace
        with self.lock:
            self.closed = True
            processes = [s.process for s in self.shards.values() if s.process is not None and s.process.poll() is None]
            for process in processes:
                leftovers.signal_group(process.pid, signal.SIGTERM)
            deadline = time.monotonic() + grace
            for process in processes:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    process.wait(max(deadline - time.monotonic(), 0))
            for process in processes:
                # The leader may be gone while children it forked still hold the group.
                leftovers.signal_group(process.pid, signal.SIGKILL)
                process.wait()
            for shard in self.shards.values():
                shard.state, shard.kill_at = "stopped", None
                self._release(shard)
            self._record()

    # -- transitions ---------------------------------------------------------------------------

    def _start(self, shard: Shard, restarting: bool = False) -> None:
        spec = shard.spec
        shard.kill_at, shard.detail = None, ""
        env = {**self.env, **spec.env}
        kind = enginekinds.BY_NAME.get(spec.engine)
        if kind is not None:
            env = kind.environment(env)
        try:
            command = self._command(shard, self._keyed(shard, kind, env), env)
            logfile = self._logfile(spec.shard)
            with logfile:
                shard.process = subprocess.Popen(
                    command,
                    env=env,
                    stdin=subprocess.DEVNULL,
                    stdout=logfile,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                    close_fds=True,
                )
        except (OSError, ValueError) as exc:
            shard.process = None
            shard.state = "failed"
            shard.detail = f"cannot start {spec.command[:1]}: {getattr(exc, 'strerror', None) or exc}"
            self._schedule_restart(shard)
            log.error("shard %s: %s", spec.shard, shard.detail)
            return
        shard.state = "restarting" if restarting else "starting"
        shard.started_at = self.clock()
        shard.leader_start = leftovers.start_time(shard.process.pid)
        log.info("shard %s: started pid %d: %s", spec.shard, shard.process.pid, " ".join(command))

    def _keyed(self, shard: Shard, kind: enginekinds.EngineKind | None, env: dict[str, str]) -> list[str]:
        """The shard's command, naming the file its API key is in when its engine reads it from one.

        Written afresh at every start (the deployment's secret may have changed), readable by
        the agent's user only, who runs the engine; ValueError when it cannot be done.
        """
        if kind is None or kind.api_key_file is None:
            return list(shard.spec.command)
        text = kind.key_file_text(env)
        if not text:
            self._forget_key(shard)
            return list(shard.spec.command)
        self.key_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        path = self._key_file(shard.spec.shard, kind)
        write_private(path, text)
        return kind.with_key_file(shard.spec.command, str(path))

    def _key_file(self, shard_id: str, kind: enginekinds.EngineKind) -> Path:
        suffix = kind.api_key_file.suffix if kind.api_key_file is not None else ""
        return self.key_dir / f"{shard_id}{suffix}"

    def _forget_key(self, shard: Shard) -> None:
        kind = enginekinds.BY_NAME.get(shard.spec.engine)
        if kind is not None and kind.api_key_file is not None:
            self._key_file(shard.spec.shard, kind).unlink(missing_ok=True)

    def _command(self, shard: Shard, command: list[str], env: dict[str, str]) -> list[str]:
        if self.cgroups is None:
            return command
        # Behind the shell that enters the cgroup, a missing binary would only show as exit code 127;
        # looked up here it fails the start with its own message, as it does without cgroups.
        if not command or shutil.which(command[0], path=env.get("PATH", os.defpath)) is None:
            raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), command[:1])
        # Placed at every start: the cgroup's time so far belongs to the engine that ran there before.
        shard.placement = self.cgroups.place(shard.spec.shard)
        if shard.placement is None:
            return command
        return cgroups.entering(shard.placement, command)

    def _release(self, shard: Shard) -> None:
        if shard.placement is not None and self.cgroups is not None:
            self.cgroups.release(shard.placement)
            shard.placement = None

    def _exited(self, shard: Shard, now: float) -> None:
        process = shard.process
        assert process is not None, "only a started shard exits"
        code = process.returncode
        # Children the engine forked may outlive it and hold its port; the group goes with its leader.
        leftovers.signal_group(process.pid, signal.SIGKILL)
        shard.exit_code = code
        shard.state = "exited"
        why = f"exited with code {code}" if code >= 0 else f"killed by signal {-code}"
        # The engine's last words are usually why it stopped (a model it could not load, a port in use).
        shard.detail = with_tail(why, self.log_dir / f"{shard.spec.shard}.log")
        self._schedule_restart(shard)
        log.warning("shard %s: %s; restarting in %.1f s", shard.spec.shard, shard.detail, shard.next_start - now)

    def _schedule_restart(self, shard: Shard) -> None:
        shard.backoff = min(max(shard.backoff * 2, self.backoff_base), self.backoff_cap)
        shard.next_start = self.clock() + shard.backoff

    def _stop(self, shard: Shard) -> None:
        if shard.process is None or shard.process.poll() is not None:
            shard.kill_at = self.clock()
            return
        if shard.kill_at is None:
            leftovers.signal_group(shard.process.pid, signal.SIGTERM)
            shard.kill_at = self.clock() + self.grace

    def _stopped(self, shard_id: str, shard: Shard) -> None:
        if shard.process is not None:
            leftovers.signal_group(shard.process.pid, signal.SIGKILL)
        shard.kill_at = None
        if shard.remove:
            self._release(shard)
            self._forget_key(shard)
            del self.shards[shard_id]
            log.info("shard %s: stopped and removed", shard_id)
        elif shard.then is not None:
            shard.spec, shard.then = shard.then, None
            shard.restarts, shard.backoff, shard.exit_code = 0, 0.0, None
            self._start(shard)
        else:
            shard.state = "stopped"

    def _record(self) -> None:
        if self.record_file is None:
            return
        live = {
            shard_id: (shard.process.pid, shard.leader_start)
            for shard_id, shard in self.shards.items()
            if shard.process is not None and shard.leader_start is not None and shard.state != "stopped"
        }
        if live != self._recorded:
            try:
                leftovers.record(self.record_file, live)
            except OSError as exc:
                # Only a later agent's clean-up depends on it; the engines run on regardless.
                log.warning("cannot record engine groups in %s: %s", self.record_file, exc.strerror)
                return
            self._recorded = live

    def _logfile(self, shard_id: str) -> BinaryIO:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        path = self.log_dir / f"{shard_id}.log"
        try:
            if path.stat().st_size > MAX_LOG_BYTES:
                path.replace(path.with_suffix(".log.1"))
        except FileNotFoundError:
            pass
        return open(path, "ab")


def write_private(path: Path, text: str) -> None:
    """`text` in a file only the agent's user may read, from the first byte on (as lib/private_files.py,
    which the agent's wheel does not hold): created 0600, an old one narrowed before it is
    written, never through a link planted where the secret goes."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    try:
        os.fchmod(fd, 0o600)
        os.write(fd, text.encode())
    finally:
        os.close(fd)


def _ready(shard: Shard) -> bool:
    """Running once the engine answers as its kind's record says (`Readiness`); a shard without a
    port once it is alive."""
    if not shard.spec.port:
        return True
    kind = enginekinds.BY_NAME.get(shard.spec.engine)
    if kind is not None and kind.readiness is enginekinds.Readiness.HEALTH:
        return _healthy(shard.spec.port)
    try:
        with socket.create_connection(("127.0.0.1", shard.spec.port), timeout=0.05):
            return True
    except OSError:
        return False


def _healthy(port: int) -> bool:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=0.1)
    try:
        connection.request("GET", "/health")
        return connection.getresponse().status == 200
    except (OSError, http.client.HTTPException):
        return False
    finally:
        connection.close()


TAIL_BYTES = 4096


def with_tail(head: str, log: Path) -> str:
    """`head`, then the end of the engine's log, as much as a status's detail holds."""
    try:
        with open(log, "rb") as handle:
            handle.seek(max(handle.seek(0, os.SEEK_END) - TAIL_BYTES, 0))
            lines = handle.read().decode(errors="replace").splitlines()
    except OSError:
        return head
    return with_last_lines(head, [line for line in lines if line.strip()])
