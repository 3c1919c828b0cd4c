"""Background parts of the stack yield the cores to the ones clients wait on, in their own sessions too.

Each part starts in a session of its own (so that it can be stopped as a group), and
where the kernel groups tasks by session (CONFIG_SCHED_AUTOGROUP, on by default in
Debian's and most distributions' kernels) a process's nice value weighs only
against the others in its session: the whole session competes with every other at
the weight of nice 0, whatever `nice` its processes run at (sched(7), "The
autogroup feature"). So `nice -n 10` on Celery and Prometheus did nothing against
the web workers, HAProxy and Redis, and their bursts took a full share of the cores.
The session's own nice, written to /proc/PID/autogroup, is what weighs there.
"""

from __future__ import annotations

from pathlib import Path

AUTOGROUP_SWITCH = Path("/proc/sys/kernel/sched_autogroup_enabled")


def autogroups_enabled() -> bool:
    """Whether this kernel schedules sessions as groups (the file is absent where it was built without them)."""
    try:
        return AUTOGROUP_SWITCH.read_text().strip() == "1"
    except OSError:
        return False


def yield_cores(pid: int, nice: int) -> bool:
    """Give the session of `pid` (its leader, any member) the weight of `nice`; False where there is none to set.

    Raising a nice value needs no privilege; the process's own `nice` still orders it
    where the kernel does not group by session.
    """
    if not autogroups_enabled():
        return False
    try:
        Path(f"/proc/{pid}/autogroup").write_text(f"{nice}\n")
    except OSError:
        return False
    return True


def session_nice(pid: int) -> int | None:
    """The nice value the kernel weighs `pid`'s session at; None where the kernel has no session groups."""
    try:
        # "/autogroup-123 nice 10"
        return int(Path(f"/proc/{pid}/autogroup").read_text().split()[-1])
    except (OSError, ValueError, IndexError):
        return None
