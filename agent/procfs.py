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
    # Processes and threads created since boot (the `processes` line): how many pids were handed out.
    forks: int | None = None


@dataclass(frozen=True)
class ProcStat:
    """The fields of /proc/<pid>/stat the agent uses."""

    pid: int
    ppid: int
    pgrp: int
    session: int
    ticks: int  # utime + stime
    start: int  # start time in ticks since boot: with the pid, names the process uniquely
    rss_pages: int


def read_cpu(proc: Path) -> CpuTicks | None:
    """busy = user+nice+system+irq+softirq; total = busy+idle+iowait+steal (guest is inside user)."""
    aggregate = None
    cpus = 0
    forks = None
    for line in _lines(proc / "stat"):
        if line.startswith("processes "):
            forks = _int(line.split()[1:2])
            continue
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
    return CpuTicks(busy=aggregate[0], total=aggregate[1], cpus=cpus, forks=forks)


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


def read_tasks(proc: Path) -> tuple[int, int] | None:
    """From /proc/loadavg: how many tasks exist and the pid the kernel handed out last.

    Pids are handed out in increasing order, wrapping at pid_max, so the last one
    tells which pids are new since an earlier reading without listing /proc.
    """
    fields = _text(proc / "loadavg").split()
    try:
        total = int(fields[3].partition("/")[2])
        last = int(fields[4])
    except (ValueError, IndexError):
        return None
    return (total, last) if last > 0 else None


def read_pid_max(proc: Path) -> int:
    # 4,194,304 is the kernel's ceiling; assuming it can only make a wrap look less likely.
    return _int(_text(proc / "sys" / "kernel" / "pid_max").split()[:1]) or 4_194_304


def read_pid_stat(proc: Path, pid: int) -> ProcStat | None:
    """One process's stat, or None if it is gone (normal) or unreadable or malformed (warned)."""
    data = read_bytes(f"{os.fspath(proc)}/{pid}/stat")
    if data is None:
        return None
    stat = parse_pid_stat(data)
    if stat is None:
        log.warning("skipping malformed %s/%d/stat: %r", proc, pid, data[:120])
    return stat


def read_tgid(proc: Path, pid: int) -> int | None:
    """The thread group of `pid`: /proc/<tid> of a thread opens too (it is only left out of the listing)."""
    data = read_bytes(f"{os.fspath(proc)}/{pid}/status", 8192)
    for line in (data or b"").splitlines():
        if line.startswith(b"Tgid:"):
            return _int(line.split()[1:2])
    return None


def read_bytes(path: str, size: int = 4096) -> bytes | None:
    """The start of a small /proc or cgroup file; None if it vanished, warned if it is unreadable otherwise."""
    try:
        fd = os.open(path, os.O_RDONLY)
        try:
            return os.read(fd, size)
        finally:
            os.close(fd)
    except (FileNotFoundError, ProcessLookupError):
        return None
    except OSError as exc:
        log.warning("cannot read %s: %s", path, exc.strerror)
        return None


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
            ppid=int(fields[1]),
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


def _int(fields: list[str] | list[bytes]) -> int | None:
    try:
        return int(fields[0])
    except (ValueError, IndexError):
        return None
