"""Every benchmark runs from a fresh clone with nothing but `make` done: as `python -m bench.NAME` from the root.

The project is not installed into the virtualenv (`make` installs requirements.txt
only), so a benchmark finds `agent`, `devstack` and the apps because it runs as a
module from the repository root, and so must any process it starts. These run
each benchmark's `--help` in an environment holding nothing of the test run
(no PYTHONPATH, no settings module), and start bench.agent_cost's child the way
the benchmark does, on a small fixture.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bench import agent_cost
from tests.agent import bigproc

ROOT = Path(__file__).resolve().parent.parent
# As the Makefile's `make bench` lists them, and the soak (`make soak`).
BENCHES = sorted(path.stem for path in (ROOT / "bench").glob("*.py") if path.stem != "__init__")


def clean_env(home: Path) -> dict[str, str]:
    return {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(home), "LANG": "C.UTF-8"}


def test_the_project_is_not_installed_so_these_tests_see_a_fresh_clone(tmp_path):
    found = subprocess.run(
        [sys.executable, "-c", "import agent"], cwd=tmp_path, env=clean_env(tmp_path), capture_output=True
    )
    assert found.returncode != 0, "agent is importable from outside the checkout: these tests would prove nothing"


def test_every_benchmark_the_makefile_runs_is_found():
    assert {"agent_cost", "heartbeat", "pages", "soak"} <= set(BENCHES)


@pytest.mark.parametrize("name", BENCHES)
def test_each_benchmark_runs_as_a_module_from_the_root(tmp_path, name):
    result = subprocess.run(
        [sys.executable, "-m", f"bench.{name}", "--help"],
        cwd=ROOT,
        env=clean_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("usage:")


def test_the_agent_cost_child_starts_from_the_root_as_the_benchmark_starts_it(tmp_path):
    host = bigproc.build(tmp_path / "proc", 200, 8, [(2, 1)], after=10)
    root = bigproc.cgroup_root(tmp_path / "cgroup")
    leaders = ",".join(str(engine.leader) for engine in host.engines)
    child = subprocess.Popen(
        agent_cost.sampler_command(host.root, root, "walk", leaders),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
        env=clean_env(tmp_path),
    )
    try:
        child.stdin.write("sample\nsample\n")
        child.stdin.close()
        answers = [json.loads(line) for line in child.stdout]
        assert child.wait(60) == 0, child.stderr.read()
    finally:
        child.kill()
        child.wait()
    assert len(answers) == 2
    assert all(answer["rss_mb"] > 0 for answer in answers)
