"""Every Redis key is named in livestate/keys.py and nowhere else."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from livestate import keys

ROOT = Path(__file__).resolve().parent.parent
KEY_LIKE = re.compile(r"^llmgw:[\w-]+(:[\w-]*)*$")


def key_constants() -> dict[str, str]:
    return {name: value for name, value in vars(keys).items() if name.isupper() and isinstance(value, str)}


def test_no_module_but_keys_spells_a_redis_key():
    found = []
    for package in ("nodes", "inventory", "livestate", "llmgw_site", "lib"):
        for path in (ROOT / package).rglob("*.py"):
            if path == ROOT / "livestate" / "keys.py":
                continue
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Constant) and isinstance(node.value, str) and KEY_LIKE.match(node.value):
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno}: {node.value}")
    assert found == []


def test_no_key_or_prefix_is_the_start_of_another():
    """Prefixes are scanned and deleted by pattern (`llmgw:nodeshards:*`): one must never match another's keys."""
    values = sorted(key_constants().values())
    assert len(values) == len(set(values)) == 22
    clashes = [(a, b) for a in values for b in values if a != b and b.startswith(a)]
    assert clashes == []


def test_every_key_says_what_it_holds():
    """Each key constant has a comment on the line above it."""
    lines = (ROOT / "livestate" / "keys.py").read_text().splitlines()
    uncommented = [
        name
        for name in key_constants()
        for i, line in enumerate(lines)
        if line.startswith(f"{name} = ") and not lines[i - 1].startswith("# ")
    ]
    assert uncommented == []
