"""CPU time by process group, from /proc/<pid>/stat, so each part's share of a heartbeat can be told apart.

A group is a set of root processes and all their descendants (granian's main
process and workers, Celery's worker and its pool), or PostgreSQL backends
serving one database, found by their process title. A process that exits between two
readings takes its CPU with it; the bench's groups keep theirs for the run.
"""

from __future__ import annotations

import os
from collections.abc import Callable

import psutil

TICK = os.sysconf("SC_CLK_TCK")


def process_seconds(pid: int) -> float | None:
    """utime + stime of one process (not its reaped children), or None once it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            raw = stat.read()
    except OSError:
        return None
    # The command name may hold spaces and parentheses: the fields start after the last ")".
    fields = raw[raw.rindex(b")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def tree(*roots: int) -> list[int]:
    pids = []
    for root in roots:
        try:
            process = psutil.Process(root)
            pids += [root, *(child.pid for child in process.children(recursive=True))]
        except psutil.NoSuchProcess:
            continue
    return pids


def postgres_backends(database: str) -> list[int]:
    """Backends serving `database` (their title is "postgres: <user> <database> <client> <what>")."""
    found = []
    for process in psutil.process_iter(["name", "cmdline"]):
        cmdline = process.info["cmdline"] or []
        if cmdline and cmdline[0].startswith("postgres:") and f" {database} " in f" {cmdline[0]} ":
            found.append(process.pid)
    return found


class Meter:
    """Readings of named groups; `since(reading)` is CPU seconds per group between two readings."""

    def __init__(self, groups: dict[str, Callable[[], list[int]]]):
        self.groups = groups

    def read(self) -> dict[str, dict[int, float]]:
        reading = {}
        for name, pids in self.groups.items():
            reading[name] = {pid: s for pid in pids() if (s := process_seconds(pid)) is not None}
        return reading

    def since(self, before: dict[str, dict[int, float]]) -> dict[str, float]:
        after = self.read()
        used = {}
        for name, now in after.items():
            then = before.get(name, {})
            # A process new since the first reading counts from zero.
            used[name] = sum(seconds - then.get(pid, 0.0) for pid, seconds in now.items())
        return used
