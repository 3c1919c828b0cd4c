"""The import contracts in pyproject.toml hold on the tree, and fail on a wrong import.

The contracts are checked by import-linter itself (`lint-imports`, as `make
lint` runs it), on the real tree and on a copy with one import that breaks a
layer, so a contract that could never fail would be caught here.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("nodes", "opsapi", "gateway", "inventory", "livestate", "agent", "llmgwctl", "llmgw_site", "devstack")
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")


def lint_imports(tree: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(LINT_IMPORTS), "--config", str(tree / "pyproject.toml"), "--no-cache"],
        cwd=tree,
        env={"PYTHONPATH": str(tree), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=120,
    )


def copy_of_tree(destination: Path) -> Path:
    for package in PACKAGES:
        shutil.copytree(ROOT / package, destination / package, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", destination / "pyproject.toml")
    return destination


def test_the_tree_keeps_every_contract():
    result = lint_imports(ROOT)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 broken" in result.stdout


@pytest.mark.parametrize(
    ("module", "wrong_import", "contract"),
    [
        ("livestate/wrong.py", "import inventory.models\n", "web app > domain > live state > wire protocol"),
        ("inventory/wrong.py", "from nodes import ratelimit\n", "web app > domain > live state > wire protocol"),
        ("inventory/wrong.py", "from gateway import models\n", "web app > domain > live state > wire protocol"),
        ("agent/protocol_wrong.py", "import livestate\n", "the agent runs on GPU machines"),
        ("agent/wrong.py", "from django.conf import settings\n", "the agent runs on GPU machines"),
        ("llmgwctl/wrong.py", "import opsapi.models\n", "the llmgw command needs nothing of the server"),
        ("inventory/wrong.py", "import devstack.ports\n", "what runs in production never imports"),
    ],
)
def test_a_wrong_import_breaks_its_contract(tmp_path, module, wrong_import, contract):
    tree = copy_of_tree(tmp_path)
    (tree / module).write_text(wrong_import)
    result = lint_imports(tree)
    assert result.returncode != 0
    broken = [line for line in result.stdout.splitlines() if line.endswith("BROKEN")]
    assert len(broken) == 1 and broken[0].startswith(contract), result.stdout


def test_the_wire_protocol_may_not_import_the_live_state(tmp_path):
    """The lowest layer is a module of the agent: a wrong import there breaks the layers too."""
    tree = copy_of_tree(tmp_path)
    protocol = tree / "agent" / "protocol.py"
    protocol.write_text(protocol.read_text() + "\nimport livestate.keys  # noqa: E402\n")
    result = lint_imports(tree)
    broken = [line for line in result.stdout.splitlines() if line.endswith("BROKEN")]
    assert any(line.startswith("web app > domain > live state > wire protocol") for line in broken), result.stdout
