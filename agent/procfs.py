"""Readers for the few /proc files the agent samples, each tolerant of a bad line.

Every reader takes the /proc root as a path so that tests can point it at a fixture
tree with known counters. A line that cannot be parsed is skipped with a warning
rather than raised: one odd kernel must not stop a node from reporting.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger("agent.procfs")


@dataclass(frozen=True)
class Roots:
    """Where the agent reads the machine from; the real roots unless a test says otherwise."""

    proc: Path = Path("/proc")
    sys: Path = Path("/sys")
    etc: Path = Path("/etc")


REAL = Roots()


@dataclass(frozen=True)
class CpuTicks:
    """Aggregate CPU counters from /proc/stat, in clock ticks, split as docs/design.md defines a load."""

    busy: int
    total: int
    cpus: int


@dataclass(frozen=True)
class ProcStat:
    """The fields of /proc/<pid>/stat the agent uses."""

    pid: int
    pgrp: int
    session: int
    ticks: int  # utime + stime
    start: int  # start time in ticks since boot: with the pid, names the process uniquely
    rss_pages: int


def read_cpu(proc: Path) -> CpuTicks | None:
    """busy = user+nice+system+irq+softirq; total = busy+idle+iowait+steal (guest is inside user)."""
    aggregate = None
    cpus = 0
    for line in _lines(proc / "stat"):
        if not line.startswith("cpu"):
            continue
        if line.startswith("cpu "):
            try:
                user, nice, system, idle, iowait, irq, softirq, steal = (int(v) for v in line.split()[1:9])
            except ValueError:
                log.warning("skipping malformed line in %s: %r", proc / "stat", line[:120])
                continue
            busy = user + nice + system + irq + softirq
            aggregate = (busy, busy + idle + iowait + steal)
        elif line[3:4].isdigit():
            cpus += 1
    if aggregate is None:
        log.warning("no aggregate cpu line in %s", proc / "stat")
        return None
    return CpuTicks(busy=aggregate[0], total=aggregate[1], cpus=cpus)


def read_meminfo(proc: Path) -> dict[str, int]:
    """The lines of /proc/meminfo as bytes, by name; malformed lines are skipped."""
    values = {}
    for line in _lines(proc / "meminfo"):
        name, _, rest = line.partition(":")
        fields = rest.split()
        try:
            value = int(fields[0])
        except (ValueError, IndexError):
            log.warning("skipping malformed line in %s: %r", proc / "meminfo", line[:120])
            continue
        values[name] = value * 1024 if fields[1:2] == ["kB"] else value
    return values


def read_loadavg(proc: Path) -> tuple[float, float, float] | None:
    text = _text(proc / "loadavg")
    try:
        one, five, fifteen = (float(v) for v in text.split()[:3])
    except ValueError:
        log.warning("skipping malformed %s: %r", proc / "loadavg", text[:120])
        return None
    return one, five, fifteen


def read_uptime(proc: Path) -> float | None:
    text = _text(proc / "uptime")
    try:
        return float(text.split()[0])
    except (ValueError, IndexError):
        log.warning("skipping malformed %s: %r", proc / "uptime", text[:120])
        return None


def scan_groups(proc: Path, pgids: set[int], outsiders: dict[int, int] | None = None) -> tuple[list[ProcStat], int]:
    """Every process whose process group is one of `pgids`, and how many entries were skipped.

    Reading /proc/<pid>/stat costs a few microseconds of kernel time per process, so
    processes already seen outside our shards' sessions are remembered in
    `outsiders` (pid → inode of /proc/<pid>) and not read again: a process can only
    join a process group of its own session, and each shard leads its own session,
    so an outsider stays one for life. The inode, free from the directory listing,
    changes when the pid is reused, and then the newcomer is read.

    A process that exits between the listing and the read is normal and skipped
    quietly; a stat line that cannot be parsed is skipped with a warning.
    """
    found: list[ProcStat] = []
    skipped = 0
    if not pgids:
        return found, skipped
    base = os.fspath(proc)
    known = outsiders if outsiders is not None else {}
    present: dict[int, int] = {}
    with os.scandir(base) as entries:
        listing = [(entry.name, entry.inode()) for entry in entries if entry.name.isdigit()]
    for name, inode in listing:
        pid = int(name)
        if known.get(pid) == inode:
            present[pid] = inode
            continue
        try:
            fd = os.open(f"{base}/{name}/stat", os.O_RDONLY)
            try:
                data = os.read(fd, 4096)
            finally:
                os.close(fd)
        except (FileNotFoundError, ProcessLookupError):
            skipped += 1
            continue
        except OSError as exc:
            log.warning("cannot read %s/%s/stat: %s", base, name, exc)
            skipped += 1
            continue
        stat = parse_pid_stat(data)
        if stat is None:
            log.warning("skipping malformed %s/%s/stat: %r", base, name, data[:120])
            skipped += 1
        elif stat.pgrp in pgids:
            found.append(stat)
        elif stat.session not in pgids:
            present[pid] = inode
    if outsiders is not None:
        outsiders.clear()
        outsiders.update(present)
    return found, skipped


def parse_pid_stat(data: bytes) -> ProcStat | None:
    # The command name sits in parentheses and may itself hold spaces and ')',
    # so the fields are counted from the last ')'.
    head, sep, tail = data.rpartition(b")")
    if not sep:
        return None
    fields = tail.split()
    try:
        pid = int(head.split(b"(", 1)[0])
        return ProcStat(
            pid=pid,
            pgrp=int(fields[2]),
            session=int(fields[3]),
            ticks=int(fields[11]) + int(fields[12]),
            start=int(fields[19]),
            rss_pages=max(int(fields[21]), 0),
        )
    except (ValueError, IndexError):
        return None


def _text(path: Path) -> str:
    try:
        return path.read_text()
    except OSError as exc:
        log.warning("cannot read %s: %s", path, exc)
        return ""


def _lines(path: Path) -> list[str]:
    return _text(path).splitlines()
