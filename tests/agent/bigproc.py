"""A fixture /proc (and cgroupfs) for a big host: many processes, many CPUs, a few engines.

Used by the agent's cost tests and by bench/agent_cost.py. Only the files the
sampler reads are written: /proc/stat (with a `cpuN` line per CPU, as a 4,096-CPU
host has), meminfo, loadavg (whose last field is the last pid handed out), uptime,
sys/kernel/pid_max, and `stat` for every process (`status` too for the engines',
which is where the walker tells a process from a thread).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

CLOCK_TICKS = 100
PAGE = 4096
PID_MAX = 4_194_304
FIRST_PID = 300


def stat_line(pid: int, comm: str, ppid: int, pgrp: int, session: int, ticks: int, start: int, rss: int) -> str:
    """A /proc/<pid>/stat line with utime = ticks, stime = 0 and the given start time and RSS (pages)."""
    return (
        f"{pid} ({comm}) S {ppid} {pgrp} {session} 0 -1 4194560 100 0 0 0 {ticks} 0 0 0 20 0 1 0 "
        f"{start} 1234567 {rss} 18446744073709551615 1 1 0 0 0 0 0 0 0 0 0 0 17 1 0 0 0 0 0\n"
    )


@dataclass
class Engine:
    """An engine's tree: its leader, the processes it forked, and a thread of a worker (not a process)."""

    leader: int
    pids: list[int]  # leader first; every process of the engine
    parents: dict[int, int]
    sessions: dict[int, int]
    thread: int | None = None


@dataclass
class BigProc:
    root: Path
    cpus: int
    pid_max: int = PID_MAX
    uptime: float = 1000.0
    last_pid: int = FIRST_PID - 1
    forks: int = 0
    total: int = 0
    ticks: dict[int, int] = field(default_factory=dict)
    engines: list[Engine] = field(default_factory=list)

    # -- building ------------------------------------------------------------------------------

    def host(self, processes: int) -> list[int]:
        """`processes` unrelated processes, each in a session of its own, on the next pids."""
        pids = []
        for _ in range(processes):
            pid = self._next_pid()
            self._write(pid, "daemon", 1, pid, pid, ticks=7, rss=100)
            pids.append(pid)
        return pids

    def engine(self, workers: int, grandchildren: int = 0) -> Engine:
        """A leader, `workers` children, `grandchildren` under the first worker (the last one in a session
        of its own, as a process that called setsid), and one thread of the first worker."""
        leader = self._next_pid()
        engine = Engine(leader, [leader], {leader: 1}, {leader: leader})
        self._write(leader, "vllm", engine.parents[leader], leader, leader, ticks=100, rss=25600, status=True)
        for _ in range(workers):
            pid = self._next_pid()
            self._add(engine, pid, leader, leader)
        first = engine.pids[1] if workers else leader
        for i in range(grandchildren):
            pid = self._next_pid()
            self._add(engine, pid, first, pid if i == grandchildren - 1 else leader)
        if workers:
            engine.thread = self._next_pid()
            # /proc/<tid> of a thread reads like its process's, with its own pid and its process's parent.
            self._write(engine.thread, "worker", leader, leader, leader, ticks=0, rss=0, tgid=first)
        self.engines.append(engine)
        return engine

    def finish(self) -> BigProc:
        cpu_lines = "".join(f"cpu{i} 100 0 100 1000 0 0 0 0 0 0\n" for i in range(self.cpus))
        busy, idle = int(self.uptime * 40), int(self.uptime * 60)
        (self.root / "stat").write_text(
            f"cpu  {busy} 0 0 {idle * self.cpus} 0 0 0 0 0 0\n{cpu_lines}"
            f"intr 0\nctxt 0\nbtime 1700000000\nprocesses {self.forks}\nprocs_running 1\nprocs_blocked 0\n"
        )
        memory = "MemTotal: 2113929216 kB\nMemFree: 1048576000 kB\nMemAvailable: 1073741824 kB\n"
        (self.root / "meminfo").write_text(memory)
        (self.root / "loadavg").write_text(f"1.00 1.00 1.00 2/{self.total} {self.last_pid}\n")
        (self.root / "uptime").write_text(f"{self.uptime:.2f} 0.00\n")
        kernel = self.root / "sys" / "kernel"
        kernel.mkdir(parents=True, exist_ok=True)
        (kernel / "pid_max").write_text(f"{self.pid_max}\n")
        return self

    # -- time passing --------------------------------------------------------------------------

    def advance(self, seconds: float, ticks_per_process: int, new_host_processes: int = 0) -> None:
        """Every engine process spends `ticks_per_process` more; some unrelated processes start."""
        self.uptime += seconds
        for engine in self.engines:
            for pid in engine.pids:
                self.ticks[pid] += ticks_per_process
                self._rewrite(engine, pid)
        self.host(new_host_processes)
        self.finish()

    # -- internals -----------------------------------------------------------------------------

    def _next_pid(self) -> int:
        # Past pid_max the kernel starts again above the pids it reserves.
        self.last_pid = self.last_pid + 1 if self.last_pid + 1 < self.pid_max else FIRST_PID
        self.forks += 1
        self.total += 1
        return self.last_pid

    def fork(self, engine: Engine, parent: int, pid: int | None = None) -> int:
        """A new process of `engine` forked by `parent`, on the next pid or the one given."""
        pid = self._next_pid() if pid is None else pid
        self._add(engine, pid, parent, engine.leader)
        return pid

    def _add(self, engine: Engine, pid: int, parent: int, session: int) -> None:
        engine.pids.append(pid)
        engine.parents[pid], engine.sessions[pid] = parent, session
        self._write(pid, "worker", parent, session, session, ticks=50, rss=1000, status=True)

    def _rewrite(self, engine: Engine, pid: int) -> None:
        session = engine.sessions[pid]
        rss = 25600 if pid == engine.leader else 1000
        self._write(pid, "worker", engine.parents[pid], session, session, ticks=self.ticks[pid], rss=rss)

    def _write(
        self,
        pid: int,
        comm: str,
        ppid: int,
        pgrp: int,
        session: int,
        ticks: int,
        rss: int,
        status: bool = False,
        tgid: int | None = None,
    ) -> None:
        directory = self.root / str(pid)
        directory.mkdir(exist_ok=True)
        self.ticks[pid] = ticks
        start = int(self.uptime * CLOCK_TICKS)
        previous = directory / "stat"
        if previous.exists():
            # The same process keeps its start time.
            start = int(previous.read_text().rsplit(")", 1)[1].split()[19])
        previous.write_text(stat_line(pid, comm, ppid, pgrp, session, ticks, start, rss))
        if status or tgid is not None:
            (directory / "status").write_text(f"Name:\t{comm}\nTgid:\t{tgid or pid}\nPid:\t{pid}\nPPid:\t{ppid}\n")


def build(root: Path, processes: int, cpus: int, engines: list[tuple[int, int]], after: int = 0) -> BigProc:
    """`processes` unrelated processes, then each engine (workers, grandchildren), then `after` more unrelated."""
    root.mkdir(parents=True, exist_ok=True)
    proc = BigProc(root, cpus)
    proc.host(processes)
    for workers, grandchildren in engines:
        proc.engine(workers, grandchildren)
    proc.host(after)
    return proc.finish()


@dataclass
class FakeCgroup:
    """An engine's cgroup laid out as cgroupfs lays it out, with counters the test sets."""

    path: Path
    usage_usec: int = 0
    memory: int | None = None
    pids: list[int] = field(default_factory=list)

    def write(self) -> FakeCgroup:
        self.path.mkdir(parents=True, exist_ok=True)
        (self.path / "cgroup.procs").write_text("".join(f"{pid}\n" for pid in self.pids))
        (self.path / "cpu.stat").write_text(
            f"usage_usec {self.usage_usec}\nuser_usec {self.usage_usec}\nsystem_usec 0\n"
            "nr_periods 0\nnr_throttled 0\nthrottled_usec 0\n"
        )
        memory = self.path / "memory.current"
        if self.memory is None:
            memory.unlink(missing_ok=True)
        else:
            memory.write_text(f"{self.memory}\n")
        return self


def cgroup_root(path: Path) -> Path:
    """An empty delegated cgroup: the files the agent checks before it creates engines' cgroups."""
    path.mkdir(parents=True, exist_ok=True)
    for name in ("cgroup.procs", "cgroup.subtree_control", "cpu.stat"):
        (path / name).write_text("")
    (path / "cpu.stat").write_text("usage_usec 0\n")
    return path
