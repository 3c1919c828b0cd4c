"""Engines in cgroups of their own, where the host has cgroup v2 and lets the agent write there.

The kernel keeps a cgroup's CPU time (`cpu.stat`'s `usage_usec`, every process and
thread that ever ran in it, exited ones included) and its memory (`memory.current`),
so measuring an engine costs three small reads however many processes the host or
the engine holds. Under systemd the unit's `Delegate=yes` hands the agent its own
cgroup; the agent moves itself into a leaf (`agent`, as cgroup v2 keeps processes out
of a cgroup whose controllers are handed down), enables the cpu and memory
controllers below and starts each engine in `engine-<shard>` beside it.

The root is a path so that tests can point it at a tree of plain files laid out like
cgroupfs. Where it is missing or read-only, engines run as before and are measured
by walking their processes (agent/descendants.py).
"""

from __future__ import annotations

import itertools
import logging
import os
from dataclasses import dataclass
from pathlib import Path

from agent import procfs

log = logging.getLogger("agent.cgroups")

MOUNT = Path("fs/cgroup")  # under /sys
AGENT_LEAF = "agent"
_serials = itertools.count(1)


@dataclass(frozen=True)
class Placement:
    """An engine's cgroup, and its CPU time when the engine went in (a reused cgroup keeps its old time)."""

    path: Path
    baseline_usec: int
    serial: int  # tells two placements in the same directory apart


@dataclass(frozen=True)
class Reading:
    usage_usec: int
    memory_bytes: int | None  # None without the memory controller
    pids: frozenset[int]


class Cgroups:
    def __init__(self, root: Path):
        self.root = Path(root)

    @classmethod
    def find(cls, roots: procfs.Roots, configured: str = "") -> Cgroups | None:
        """The configured root, else the agent's own systemd service cgroup (v2); None where it is not writable."""
        if configured:
            root = Path(configured)
        else:
            mount = roots.sys / MOUNT
            if not (mount / "cgroup.controllers").exists():
                return None  # no cgroup v2 at /sys/fs/cgroup (absent, or the v1 or hybrid layout)
            own = _own_cgroup(roots.proc)
            # Only a systemd service's cgroup is taken unasked: one with Delegate=yes is the agent's to
            # divide, and anywhere else (a login session, a container) the operator names the root.
            if own is None or not own.endswith(".service"):
                return None
            root = mount / own.lstrip("/")
        if not os.access(root / "cgroup.procs", os.W_OK) or not os.access(root, os.W_OK):
            log.info("cgroup %s is not writable by the agent; measuring engines by their processes", root)
            return None
        return cls(root)

    def prepare(self, agent_pid: int | None = None) -> None:
        """Leave the root free of processes and hand the cpu and memory controllers down; both may fail."""
        pid = os.getpid() if agent_pid is None else agent_pid
        if pid in _pids(self.root / "cgroup.procs"):
            leaf = self.root / AGENT_LEAF
            try:
                leaf.mkdir(exist_ok=True)
                _write(leaf / "cgroup.procs", str(pid))
            except OSError as exc:
                log.warning("cannot move the agent into %s: %s", leaf, exc.strerror)
        for controller in ("cpu", "memory"):
            try:
                _write(self.root / "cgroup.subtree_control", f"+{controller}")
            except OSError as exc:
                # Without it, usage_usec is still kept (it is core); memory is summed from the processes.
                log.info("cannot enable the %s controller in %s: %s", controller, self.root, exc.strerror)

    def place(self, shard: str) -> Placement | None:
        """The cgroup a shard's engine is to enter; None if it cannot be made (the engine runs anyway)."""
        path = self.root / f"engine-{shard}"
        try:
            path.mkdir(exist_ok=True)
        except OSError as exc:
            log.warning("cannot create cgroup %s: %s", path, exc.strerror)
            return None
        usage = read_usage(path)
        return Placement(path, usage or 0, next(_serials))

    def release(self, placement: Placement) -> None:
        try:
            placement.path.rmdir()
        except OSError as exc:
            # Busy while a process of the engine is still dying; the next start reuses it.
            log.debug("cgroup %s kept: %s", placement.path, exc.strerror)


def read(placement: Placement) -> Reading | None:
    usage = read_usage(placement.path)
    if usage is None:
        return None
    memory = procfs.read_bytes(os.fspath(placement.path / "memory.current"), 64)
    try:
        memory_bytes = int(memory) if memory is not None else None
    except ValueError:
        memory_bytes = None
    return Reading(usage, memory_bytes, _pids(placement.path / "cgroup.procs"))


def read_usage(path: Path) -> int | None:
    data = procfs.read_bytes(os.fspath(path / "cpu.stat"))
    for line in (data or b"").splitlines():
        if line.startswith(b"usage_usec "):
            try:
                return int(line.split()[1])
            except ValueError:
                break
    return None


def entering(placement: Placement, command: list[str]) -> list[str]:
    """`command` run so that its first process enters the cgroup before it becomes the engine.

    Moving the engine after it started would leave out whatever it forked first. The
    shell writes its own pid and then becomes the engine with exec, so the pid the
    runner knows is the engine's; if the write fails the engine still starts, and the
    sampler, not finding it in the cgroup, walks its processes instead.
    """
    script = '{ echo $$ > "$1"; } 2>/dev/null; shift; exec "$@"'
    return ["/bin/sh", "-c", script, "llmgw-engine", os.fspath(placement.path / "cgroup.procs"), *command]


def _own_cgroup(proc: Path) -> str | None:
    data = procfs.read_bytes(os.fspath(proc / "self" / "cgroup"), 65536) or b""
    for line in data.decode(errors="replace").splitlines():
        if line.startswith("0::"):
            return line[3:]
    return None


def _pids(path: Path) -> frozenset[int]:
    try:
        text = path.read_text()
    except OSError:
        return frozenset()
    return frozenset(int(word) for word in text.split() if word.isdigit())


def _write(path: Path, text: str) -> None:
    # cgroupfs takes each write whole; an opened-for-append text file could split or buffer it.
    fd = os.open(path, os.O_WRONLY)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)
