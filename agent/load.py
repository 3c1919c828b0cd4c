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

from agent import procfs, protocol

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


class Sampler:
    """Turns two consecutive readings of /proc into a `protocol.Load`."""

    def __init__(self, proc_root: Path = Path("/proc"), clock_ticks: int = CLOCK_TICKS, page_size: int = PAGE_SIZE):
        self.proc = Path(proc_root)
        self.clock_ticks = clock_ticks
        self.page_size = page_size
        self.previous = _Previous()
        # The pids last seen in our shards' groups, so discovery can tell our GPU users from foreign ones.
        self.own_pids: frozenset[int] = frozenset()
        self.outsiders: dict[int, int] = {}

    def sample(self, groups: Mapping[str, int]) -> protocol.Load | None:
        """Read now; return the load since the previous call (None on the first one or if /proc is unreadable).

        `groups` maps each running shard to its process group id.
        """
        uptime = procfs.read_uptime(self.proc)
        cpu = procfs.read_cpu(self.proc)
        processes, skipped = procfs.scan_groups(self.proc, set(groups.values()), self.outsiders)
        if skipped:
            log.debug("skipped %d processes that exited or could not be read while /proc was scanned", skipped)
        previous, self.previous = self.previous, _Previous(cpu, uptime, {(p.pid, p.start): p.ticks for p in processes})
        self.own_pids = frozenset(p.pid for p in processes)
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
            shards=self._shard_loads(groups, processes, previous, wall),
        )

    def _shard_loads(self, groups, processes, previous: _Previous, wall: float) -> list[protocol.ShardLoad]:
        # A process born since the previous reading spent all its time inside this
        # interval; one seen before contributes its growth; one that was already
        # alive but not seen (it joined the group late) only sets a baseline.
        born_after = previous.uptime * self.clock_ticks
        ticks_by_group: dict[int, int] = {}
        rss_by_group: dict[int, int] = {}
        for p in processes:
            before = previous.ticks.get((p.pid, p.start))
            if before is not None:
                spent = max(p.ticks - before, 0)
            elif p.start >= born_after:
                spent = p.ticks
            else:
                spent = 0
            ticks_by_group[p.pgrp] = ticks_by_group.get(p.pgrp, 0) + spent
            rss_by_group[p.pgrp] = rss_by_group.get(p.pgrp, 0) + p.rss_pages
        return [
            protocol.ShardLoad(
                shard=shard,
                cpu_cores=round(ticks_by_group.get(pgid, 0) / self.clock_ticks / wall, 4),
                rss_bytes=rss_by_group.get(pgid, 0) * self.page_size,
            )
            for shard, pgid in sorted(groups.items())
        ]


def cpu_percent(before: procfs.CpuTicks, after: procfs.CpuTicks) -> float:
    """Busy share of all cores between two readings, 0 when the counters did not advance."""
    total = after.total - before.total
    busy = after.busy - before.busy
    if total <= 0:
        return 0.0
    return round(min(max(busy / total * 100, 0.0), 100.0), 2)
