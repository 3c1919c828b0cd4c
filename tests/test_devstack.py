"""The development package: what it promises to tests and tools, and the one-way dependency on it."""

from __future__ import annotations

import ast
import itertools
from pathlib import Path

import pytest

from devstack.polling import wait_until

ROOT = Path(__file__).resolve().parent.parent
APPS = ("agent", "inventory", "nodes", "llmgw_site", "lib")
NOT_OURS = {".venv", ".git", "var", "static", "node_modules"}


def project_files() -> list[Path]:
    return [path for path in ROOT.rglob("*.py") if not NOT_OURS & set(path.relative_to(ROOT).parts)]


def imported_modules(path: Path) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
    return found


def test_wait_until_returns_once_the_condition_holds():
    calls = itertools.count()
    wait_until(lambda: next(calls) == 3, 5, "the fourth call")
    assert next(calls) == 4


def test_wait_until_names_what_it_waited_for_when_the_deadline_passes():
    with pytest.raises(TimeoutError, match=r"after 0\.1 s waiting for the impossible"):
        wait_until(lambda: False, 0.1, "the impossible", interval=0.01)


def test_no_part_of_the_control_plane_or_the_agent_imports_devstack():
    offenders = [
        str(path.relative_to(ROOT))
        for app in APPS
        for path in (ROOT / app).rglob("*.py")
        if any(name == "devstack" or name.startswith("devstack.") for name in imported_modules(path))
    ]
    assert offenders == []


def test_no_module_patches_sys_path():
    # Tools run as modules from the repository root (python -m bench.heartbeat) and pytest
    # puts the root on the path (pyproject's pythonpath), so nothing needs to.
    offenders = [
        f"{path.relative_to(ROOT)}:{node.lineno}"
        for path in project_files()
        for node in ast.walk(ast.parse(path.read_text(), str(path)))
        if isinstance(node, ast.Attribute)
        and node.attr == "path"
        and isinstance(node.value, ast.Name)
        and node.value.id == "sys"
    ]
    assert offenders == []
