"""The stack's background parts (Celery, Prometheus) run at a lower weight than the parts clients wait on,
in the kernel's terms: their own nice, and, where the kernel groups tasks by session, their session's."""

import os
from pathlib import Path

import pytest

from devstack import priority
from devstack.polling import wait_until
from devstack.stack import BACKGROUND_NICE, Part, Stack


def own_nice(pid: int) -> int:
    # /proc/PID/stat: the 19th field is the nice value; the command (2nd) may hold spaces, so count from its ")".
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[16])


@pytest.fixture
def stack(tmp_path):
    started = Stack(tmp_path / "var")
    yield started
    started.stop_all()


def test_a_background_part_runs_niced_and_so_does_its_session(stack):
    stack.start(Part("batch", ["sleep", "60"], background=True))
    stack.start(Part("serving", ["sleep", "60"]))
    batch, serving = stack.parts["batch"].pid, stack.parts["serving"].pid

    # Relative to this process's, which the parts inherit (a CI runner may itself run niced).
    ours = os.getpriority(os.PRIO_PROCESS, 0)
    # `nice` sets it, then runs the part: a moment after the start returns.
    wait_until(lambda: own_nice(batch) == min(ours + BACKGROUND_NICE, 19), 5, "the background part at its nice")
    assert own_nice(serving) == ours
    if not priority.autogroups_enabled():
        pytest.skip("this kernel does not group tasks by session; the process's own nice is what weighs")
    # Each part leads a session of its own, and the kernel weighs sessions against each other by these.
    assert priority.session_nice(batch) == BACKGROUND_NICE
    assert priority.session_nice(serving) == 0


def test_celery_and_prometheus_are_the_background_parts(stack):
    assert stack.celery_part().background
    prometheus = stack.prometheus_part()
    assert prometheus is None or prometheus.background
    assert not stack.proxy_part().background
    assert not stack.web_part(0).background
