"""Load between two samples: CPU across all cores, memory, load averages, and each shard's share.

The definitions are docs/design.md's ("What a load measures"). The sampler keeps only the previous sample, so
its memory does not depend on how long the control plane has been unreachable.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from agent import cgroups, descendants, procfs, protocol

log = logging.getLogger("agent.load")

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
PAGE_SIZE = os.sysconf("SC_PAGE_SIZE")


@dataclass
class _Previous:
    cpu: procfs.CpuTicks | None = None
    uptime: float | None = None
    # Ticks per process keyed by (pid, start time): a pid the kernel reused for a
    # new process has another start time, so it is never subtracted from the old one.
    ticks: dict[tuple[int, int], int] = field(default_factory=dict)
    # Per shard in a cgroup: (placement serial, usage_usec), so a new placement is never subtracted from an old one.
    usage: dict[str, tuple[int, int]] = field(default_factory=dict)


@dataclass(frozen=True)
class _Measured:
    """One shard's reading: through its cgroup, or the processes the walker found."""

    placement: cgroups.Placement | None = None
    reading: cgroups.Reading | None = None
    members: tuple[descendants.Member, ...] = ()


class Sampler:
    """Turns two consecutive readings of /proc (and the engines' cgroups) into a `protocol.Load`."""

    def __init__(self, proc_root: Path = Path("/proc"), clock_ticks: int = CLOCK_TICKS, page_size: int = PAGE_SIZE):
        self.proc = Path(proc_root)
        self.clock_ticks = clock_ticks
        self.page_size = page_size
        self.previous = _Previous()
        self.walker = descendants.Descendants(self.proc)
        # The pids last seen in our shards, so discovery can tell our GPU users from foreign ones.
        self.own_pids: frozenset[int] = frozenset()

    def sample(
        self, groups: Mapping[str, int], placements: Mapping[str, cgroups.Placement] | None = None
    ) -> protocol.Load | None:
        """Read now; return the load since the previous call (None on the first one or if /proc is unreadable).

        `groups` maps each running shard to its leader's pid (its process group id);
        `placements` names the shards' cgroups, where they have one.
        """
        uptime = procfs.read_uptime(self.proc)
        cpu = procfs.read_cpu(self.proc)
        measured = self._measure(groups, placements or {}, cpu.forks if cpu else None)
        previous, self.previous = (
            self.previous,
            _Previous(
                cpu,
                uptime,
                {(m.stat.pid, m.stat.start): m.stat.ticks for shard in measured.values() for m in shard.members},
                {
                    s: (m.placement.serial, m.reading.usage_usec)
                    for s, m in measured.items()
                    if m.reading is not None and m.placement is not None
                },
            ),
        )
        self.own_pids = frozenset(
            pid
            for m in measured.values()
            for pid in (m.reading.pids if m.reading is not None else (x.stat.pid for x in m.members))
        )
        if cpu is None or uptime is None or previous.cpu is None or previous.uptime is None:
            return None
        wall = uptime - previous.uptime
        if wall <= 0:
            return None

        meminfo = procfs.read_meminfo(self.proc)
        total = meminfo.get("MemTotal", 0)
        available = meminfo.get("MemAvailable")
        if available is None:
            # Kernels before 3.14 lack MemAvailable; this is the estimate they would have given.
            available = meminfo.get("MemFree", 0) + meminfo.get("Buffers", 0) + meminfo.get("Cached", 0)
        loadavg = procfs.read_loadavg(self.proc) or (0.0, 0.0, 0.0)

        return protocol.Load(
            cpu_percent=cpu_percent(previous.cpu, cpu),
            cpus=cpu.cpus,
            load1=loadavg[0],
            load5=loadavg[1],
            load15=loadavg[2],
            memory_used_bytes=max(total - available, 0),
            memory_available_bytes=min(max(available, 0), protocol.MAX_COUNT),
            interval_seconds=round(wall, 3),
            shards=[self._shard_load(shard, measured[shard], previous, wall) for shard in sorted(groups)],
        )

    def _measure(
        self, groups: Mapping[str, int], placements: Mapping[str, cgroups.Placement], forks: int | None
    ) -> dict[str, _Measured]:
        measured: dict[str, _Measured] = {}
        for shard, leader in groups.items():
            placement = placements.get(shard)
            reading = cgroups.read(placement) if placement is not None else None
            # An engine not (yet) in its cgroup, or a cgroup gone, is measured by its processes instead.
            if reading is not None and leader in reading.pids:
                measured[shard] = _Measured(placement, reading)
        walked = {leader: shard for shard, leader in groups.items() if shard not in measured}
        by_leader: dict[int, list[descendants.Member]] = {leader: [] for leader in walked}
        for member in self.walker.scan(set(walked), forks):
            by_leader[member.leader].append(member)
        for leader, shard in walked.items():
            measured[shard] = _Measured(members=tuple(by_leader[leader]))
        return measured

    def _shard_load(self, shard: str, measured: _Measured, previous: _Previous, wall: float) -> protocol.ShardLoad:
        if measured.reading is not None and measured.placement is not None:
            return protocol.ShardLoad(
                shard=shard,
                cpu_cores=round(
                    self._cgroup_usec(shard, measured.placement, measured.reading, previous) / 1e6 / wall, 4
                ),
                rss_bytes=self._cgroup_memory(measured.reading),
            )
        # A process born since the previous reading spent all its time inside this
        # interval; one seen before contributes its growth; one that was already
        # alive but not seen (it was not yet the engine's) only sets a baseline.
        assert previous.uptime is not None, "a load is made only against a previous sample"
        born_after = previous.uptime * self.clock_ticks
        ticks = 0
        for member in measured.members:
            p = member.stat
            before = previous.ticks.get((p.pid, p.start))
            if before is not None:
                ticks += max(p.ticks - before, 0)
            elif p.start >= born_after:
                ticks += p.ticks
        return protocol.ShardLoad(
            shard=shard,
            cpu_cores=round(ticks / self.clock_ticks / wall, 4),
            rss_bytes=sum(m.stat.rss_pages for m in measured.members) * self.page_size,
        )

    def _cgroup_usec(
        self, shard: str, placement: cgroups.Placement, reading: cgroups.Reading, previous: _Previous
    ) -> int:
        before = previous.usage.get(shard)
        if before is not None and before[0] == placement.serial:
            return max(reading.usage_usec - before[1], 0)
        # Placed since the previous reading (or first found in it now): its time since placement is new.
        return max(reading.usage_usec - placement.baseline_usec, 0)

    def _cgroup_memory(self, reading: cgroups.Reading) -> int:
        if reading.memory_bytes is not None:
            return min(reading.memory_bytes, protocol.MAX_COUNT)
        # Without the memory controller the kernel keeps no total; the members' RSS is the same figure
        # as a walked engine's.
        stats = (procfs.read_pid_stat(self.proc, pid) for pid in reading.pids)
        return sum(stat.rss_pages for stat in stats if stat is not None) * self.page_size


def cpu_percent(before: procfs.CpuTicks, after: procfs.CpuTicks) -> float:
    """Busy share of all cores between two readings, 0 when the counters did not advance."""
    total = after.total - before.total
    busy = after.busy - before.busy
    if total <= 0:
        return 0.0
    return round(min(max(busy / total * 100, 0.0), 100.0), 2)
