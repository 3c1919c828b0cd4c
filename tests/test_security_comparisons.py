"""No secret is compared with `==` anywhere tokens are handled: a byte-by-byte compare leaks its prefix through timing.

The scan once read a folder that had been renamed away and so passed on no code
at all (issue 22, item 12): each folder it names must exist and hold Python, and
the scanner is shown to catch a known bad comparison, so this check can fail.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# Every package that reads a token, a join token, a password or a digest of one.
SCANNED = (
    "nodes",
    "opsapi",
    "inventory",
    "livestate",
    "llmgw_site",
    "lib",
    "devstack",
    "llmgwctl",
    "llmgw_transport",
)
SUSPICIOUS = ("token", "secret", "digest", "password", "bearer")


def named(part: ast.expr) -> str:
    """What a side of a comparison is called: `card.token_digest` is a digest, `token.scope` is a scope."""
    if isinstance(part, ast.Attribute):
        return part.attr
    if isinstance(part, ast.Name):
        return part.id
    if isinstance(part, ast.Subscript):
        return named(part.value)
    return ast.unparse(part)


def equality_on_secrets(source: str) -> list[tuple[int, str]]:
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Compare) and any(isinstance(op, ast.Eq | ast.NotEq) for op in node.ops):
            sides = (node.left, *node.comparators)
            # Against a literal ("" or None) nothing secret is measured.
            if any(isinstance(side, ast.Constant) for side in sides):
                continue
            if any(word in named(side).lower() for side in sides for word in SUSPICIOUS):
                found.append((node.lineno, ast.unparse(node)))
    return found


def test_the_scanner_catches_an_equality_on_a_token():
    assert equality_on_secrets("if card.token_digest == digest(sent): pass")
    assert equality_on_secrets("ok = bearer != plane.join_token")
    assert not equality_on_secrets("if token.scope == Scope.OPERATE: pass")
    assert not equality_on_secrets("if token == '': pass")


def test_every_scanned_folder_exists_and_holds_code():
    for folder in SCANNED:
        assert (ROOT / folder).is_dir(), f"{folder}/ is gone: scan the folder that replaced it"
        assert list((ROOT / folder).glob("**/*.py")), f"{folder}/ holds no Python"


def test_no_secret_is_compared_with_equality_anywhere_in_the_code():
    found = [
        f"{path.relative_to(ROOT)}:{line}: {text}"
        for folder in SCANNED
        for path in sorted((ROOT / folder).glob("**/*.py"))
        for line, text in equality_on_secrets(path.read_text())
    ]
    assert found == []
