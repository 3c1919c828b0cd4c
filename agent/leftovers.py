"""Engine groups a previous agent left running, found and stopped at start.

Engines run in sessions of their own, so an agent killed with SIGKILL (or by the
OOM killer) leaves them running, holding their ports and GPUs; the next agent would
start a second copy that cannot bind. So the runner records each live group's
leader as (pid, start time) in the state directory, and a starting agent stops the
groups whose leader is still that same process. The start time guards against a pid
the kernel has since given to something else.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import time
from pathlib import Path

from agent import procfs

log = logging.getLogger("agent.runner")


def start_time(pid: int, proc: Path = procfs.REAL.proc) -> int | None:
    try:
        stat = procfs.parse_pid_stat((proc / str(pid) / "stat").read_bytes())
    except OSError:
        return None
    return stat.start if stat is not None and stat.pgrp == pid else None


def record(path: Path, leaders: dict[str, tuple[int, int]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({shard: list(leader) for shard, leader in leaders.items()}))
    os.replace(tmp, path)


def reap(path: Path, grace: float, proc: Path = procfs.REAL.proc) -> list[str]:
    """Stop the recorded groups still led by the recorded process; return their shard ids."""
    try:
        recorded = json.loads(path.read_text())
    except (OSError, ValueError):
        return []
    alive = {}
    for shard, leader in recorded.items() if isinstance(recorded, dict) else ():
        try:
            pid, start = int(leader[0]), int(leader[1])
        except (TypeError, ValueError, IndexError):
            continue
        if pid > 1 and start_time(pid, proc) == start:
            alive[shard] = pid
    for shard, pgid in alive.items():
        log.warning("shard %s: stopping group %d left running by a previous agent", shard, pgid)
        signal_group(pgid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and any(_exists(pgid) for pgid in alive.values()):
        time.sleep(0.05)
    for pgid in alive.values():
        signal_group(pgid, signal.SIGKILL)
    path.unlink(missing_ok=True)
    return sorted(alive)


def _exists(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
        return True
    except (ProcessLookupError, PermissionError):
        return False


def signal_group(pgid: int, sig: int) -> None:
    """Signal a whole process group; one that is already gone is no error."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)
