"""The agent's modules import one another one way only.

Every import counts, including those under `if TYPE_CHECKING:` and inside functions:
a cycle hidden there still means a type lives in the wrong module.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "agent"


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path: Path, modules: set[str]) -> set[str]:
    """The agent modules `path` names in any import statement, wherever it stands in the file."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            # `from agent import protocol` imports the module agent.protocol.
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return found & modules


def import_graph() -> dict[str, set[str]]:
    paths = {module_name(path): path for path in PACKAGE.rglob("*.py")}
    return {name: imports_of(path, set(paths)) - {name} for name, path in paths.items()}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle as a list of modules (the first repeated at the end), or None."""
    done: set[str] = set()

    def visit(name: str, trail: list[str]) -> list[str] | None:
        if name in trail:
            return [*trail[trail.index(name) :], name]
        if name in done:
            return None
        for imported in sorted(graph[name]):
            cycle = visit(imported, [*trail, name])
            if cycle:
                return cycle
        done.add(name)
        return None

    for name in sorted(graph):
        cycle = visit(name, [])
        if cycle:
            return cycle
    return None


def test_the_agent_has_no_import_cycle():
    cycle = find_cycle(import_graph())
    assert cycle is None, " -> ".join(cycle)


def test_the_check_finds_a_cycle_behind_type_checking(tmp_path):
    # The shape the agent had: config imports engines, engines imports config for a type only.
    (tmp_path / "config.py").write_text("from agent.engines import ENGINES\n")
    (tmp_path / "engines.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from agent.config import ShardConfig\n"
    )
    modules = {"agent.config", "agent.engines"}
    graph = {f"agent.{p.stem}": imports_of(p, modules) for p in tmp_path.glob("*.py")}
    assert find_cycle(graph) == ["agent.config", "agent.engines", "agent.config"]
