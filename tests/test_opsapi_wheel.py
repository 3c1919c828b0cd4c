"""The installable programs: a wheel with `llmgw-agent` and `llmgw`, their pinned dependencies, and no Django.

Built from a copy of the sources (so no build/ or egg-info lands in the
checkout), installed into a fresh virtualenv that sees nothing of ours, and
run from there. Installing the dependencies needs PyPI or pip's cache.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.slow


def pinned(requirements: str) -> dict[str, str]:
    pins = {}
    for line in requirements.splitlines():
        match = re.match(r"^([A-Za-z0-9_.\-\[\]]+)==(\S+)", line.strip())
        if match:
            pins[match.group(1).lower()] = match.group(2)
    return pins


def test_the_wheels_pins_are_requirements_txts():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    wanted = pinned("\n".join(project["dependencies"] + project["optional-dependencies"]["nvidia"]))
    locked = pinned((ROOT / "requirements.txt").read_text())
    assert {name: locked.get(name) for name in wanted} == wanted
    assert not any(name.startswith("django") for name in wanted)


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    source = tmp_path_factory.mktemp("source")
    shutil.copy(ROOT / "pyproject.toml", source)
    for package in ("agent", "llmgwctl", "llmgw_transport"):
        shutil.copytree(ROOT / package, source / package, ignore=shutil.ignore_patterns("__pycache__"))
    dist = tmp_path_factory.mktemp("dist")
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(dist), str(source)],
        check=True,
    )
    (built,) = dist.glob("llmgw-*.whl")
    return built


def test_the_wheel_holds_the_agent_and_the_cli_only(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    assert {name.split("/")[0] for name in names if not name.startswith("llmgw-")} == {
        "agent",
        "llmgwctl",
        "llmgw_transport",
    }
    metadata = zipfile.ZipFile(wheel).read(next(n for n in names if n.endswith("METADATA"))).decode()
    requires = [line for line in metadata.splitlines() if line.startswith("Requires-Dist:")]
    assert not [line for line in requires if "django" in line.lower()]
    entry_points = zipfile.ZipFile(wheel).read(next(n for n in names if n.endswith("entry_points.txt"))).decode()
    assert "llmgw-agent = agent.__main__:main" in entry_points and "llmgw = llmgwctl.main:main" in entry_points


def test_installed_into_a_fresh_venv_both_programs_run(wheel, tmp_path):
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    pip = [str(venv / "bin" / "python"), "-m", "pip", "--disable-pip-version-check", "-q"]
    subprocess.run([*pip, "install", str(wheel)], check=True, timeout=300)
    # Run from elsewhere, so nothing of the checkout can be imported by accident.
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    help_text = subprocess.run(
        [str(venv / "bin" / "llmgw"), "--help"], cwd=elsewhere, capture_output=True, text=True, check=True
    ).stdout
    assert "exit codes:" in help_text
    (tmp_path / "join-token").write_text("join-secret")
    config = tmp_path / "agent.yaml"
    config.write_text(
        f"control_plane: http://127.0.0.1:9\njoin_token_file: {tmp_path / 'join-token'}\n"
        f"state_dir: {tmp_path / 'state'}\ninterval: 0.2\nengines: {{}}\nlabels: {{role: wheel}}\n"
    )
    printed = subprocess.run(
        [str(venv / "bin" / "llmgw-agent"), "--config", str(config), "--once", "--print"],
        cwd=elsewhere,
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout
    assert json.loads(printed)["inventory"]["labels"] == {"role": "wheel"}
    modules = subprocess.run(
        [str(venv / "bin" / "python"), "-c", "import importlib.util as u; print(u.find_spec('django'))"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert modules.strip() == "None"
