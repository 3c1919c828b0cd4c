"""The processes of each engine found without reading every process on the host.

Where an engine has no cgroup of its own, its processes are its leader and what the
leader forked. A host can hold 100,000 processes, and reading each one's
/proc/<pid>/stat costs the kernel microseconds and us more, so the walker remembers
only the engines' own processes and, at each sample, reads:

- each known engine process again (its counters, and whether it still lives), and
- the pids handed out since the previous sample, which /proc/loadavg names without a
  listing: the kernel hands pids out in increasing order, wrapping at pid_max, so the
  new ones lie between the last pid seen then and the last pid now.

A new pid belongs to an engine when its parent does (pids are examined in the order
they were handed out, so a parent is known before its child) or when it is in the
engine's session: each engine leads a session of its own, and a process whose parent
has already exited has been re-parented but keeps the session. A process that forked
from an engine, left its session and lost its parent before it was seen is missed.

When more pids were handed out than can be probed one by one more cheaply than
listing /proc, the listing is read once instead (only names; stat only for new pids).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from agent import procfs

log = logging.getLogger("agent.descendants")

# The kernel never hands out pids below this once pid_max has been reached (RESERVED_PIDS).
RESERVED_PIDS = 300


@dataclass(frozen=True)
class Member:
    leader: int
    stat: procfs.ProcStat


class Descendants:
    def __init__(self, proc: Path):
        self.proc = Path(proc)
        self.pid_max = procfs.read_pid_max(self.proc)
        # pid → (start time, leader): only the engines' processes, so memory follows the engines, not the host.
        self.members: dict[int, tuple[int, int]] = {}
        self.last_pid: int | None = None
        self.forks: int | None = None

    def scan(self, leaders: set[int], forks: int | None = None) -> list[Member]:
        """Every live process of each engine in `leaders`, with its leader.

        `forks` is /proc/stat's count of tasks created since boot; when more were
        created than there are pids, every pid may be new and all are examined.
        """
        tasks = procfs.read_tasks(self.proc)
        if not leaders:
            # Nothing to look for; pids handed out meanwhile cannot belong to an engine started later.
            self.members.clear()
            self.last_pid, self.forks = (tasks[1] if tasks else None), forks
            return []
        found: dict[int, Member] = {}
        self._reread(leaders, found)
        new_leaders = [pid for pid in leaders if pid not in self.members]
        for leader in new_leaders:
            stat = procfs.read_pid_stat(self.proc, leader)
            if stat is not None:
                self._add(found, stat, leader)
        if tasks is None:
            # Without /proc/loadavg's last pid there is no telling which pids are new.
            self._examine_listing(None, leaders, found)
        else:
            self._examine_new(tasks, new_leaders, leaders, forks, found)
        self.forks = forks
        return list(found.values())

    def _reread(self, leaders: set[int], found: dict[int, Member]) -> None:
        for pid, (start, leader) in list(self.members.items()):
            stat = procfs.read_pid_stat(self.proc, pid) if leader in leaders else None
            # A different start time is another process on a reused pid; it is examined like any new pid.
            if stat is None or stat.start != start:
                del self.members[pid]
            else:
                found[pid] = Member(leader, stat)

    def _examine_new(
        self,
        tasks: tuple[int, int],
        new_leaders: list[int],
        leaders: set[int],
        forks: int | None,
        found: dict[int, Member],
    ) -> None:
        total, last = tasks
        since = last if self.last_pid is None else self.last_pid
        # A leader first seen now may have forked before this sample: its children were handed out after it.
        for leader in new_leaders:
            if self._distance(leader, last) > self._distance(since, last):
                since = leader
        self.last_pid = last
        wrapped = forks is not None and self.forks is not None and forks - self.forks >= self.pid_max - RESERVED_PIDS
        if wrapped:
            log.info("more pids were handed out than exist since the last sample; examining every process")
            self._examine_listing(None, leaders, found)
            return
        count = self._distance(since, last)
        if count == 0:
            return
        if count <= max(total, 1024):
            for pid in self._pids_after(since, last):
                self._examine(pid, leaders, found)
        else:
            self._examine_listing((since, last), leaders, found)

    def _examine_listing(self, window: tuple[int, int] | None, leaders: set[int], found: dict[int, Member]) -> None:
        """Names from one listing of /proc, the new ones (or all) examined in the order they were handed out."""
        with os.scandir(self.proc) as entries:
            pids = [int(entry.name) for entry in entries if entry.name.isdigit()]
        if window is not None:
            since, last = window
            pids = [pid for pid in pids if 0 < self._distance(since, pid) <= self._distance(since, last)]
            pids.sort(key=lambda pid: self._distance(since, pid))
        for pid in pids:
            self._examine(pid, leaders, found)

    def _examine(self, pid: int, leaders: set[int], found: dict[int, Member]) -> None:
        if pid in self.members:
            return
        stat = procfs.read_pid_stat(self.proc, pid)
        if stat is None:
            return
        parent = self.members.get(stat.ppid)
        if parent is not None:
            leader = parent[1]
        elif stat.session in leaders:
            leader = stat.session
        else:
            return
        tgid = procfs.read_tgid(self.proc, pid)
        if tgid is not None and tgid != pid:
            return  # a thread: its process's stat already counts it
        self._add(found, stat, leader)

    def _add(self, found: dict[int, Member], stat: procfs.ProcStat, leader: int) -> None:
        self.members[stat.pid] = (stat.start, leader)
        found[stat.pid] = Member(leader, stat)

    def _distance(self, since: int, pid: int) -> int:
        """How many pids the kernel hands out after `since` up to `pid`, wrapping at pid_max."""
        if pid >= since:
            return pid - since
        if pid < RESERVED_PIDS:
            return self.pid_max  # never handed out after a wrap: outside every window
        return (self.pid_max - 1 - since) + (pid - RESERVED_PIDS + 1)

    def _pids_after(self, since: int, last: int) -> Iterator[int]:
        if last >= since:
            yield from range(since + 1, last + 1)
        else:
            yield from range(since + 1, self.pid_max)
            yield from range(RESERVED_PIDS, last + 1)
