"""Secrets in files are private from their first byte, never written and then narrowed (issue 22, item 10).

Each test disables `chmod` (both kinds) and sets the usual umask 022: a file
that is private only because a chmod came after its writing is then left
readable by all, as it was for a moment before.
"""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from devstack.stack import Stack
from lib.private_files import write_private

ROOT = Path(__file__).resolve().parent.parent
NO_CHMOD = "import os, pathlib; pathlib.Path.chmod = lambda *a, **k: None; os.fchmod = lambda *a: None; os.umask(0o022)"


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.fixture
def no_chmod(monkeypatch):
    monkeypatch.setattr(Path, "chmod", lambda *a, **k: None)
    monkeypatch.setattr(os, "fchmod", lambda *a: None)
    previous = os.umask(0o022)
    yield
    os.umask(previous)


def test_the_development_secret_key_is_private_from_its_first_byte(tmp_path):
    env = {
        **os.environ,
        "DEBUG": "true",
        "LLMGW_VAR_DIR": str(tmp_path),
        "DJANGO_SETTINGS_MODULE": "llmgw_site.settings",
    }
    env.pop("SECRET_KEY", None)
    code = f"{NO_CHMOD}; import django; django.setup()"
    subprocess.run([sys.executable, "-c", code], env=env, cwd=ROOT, check=True, timeout=60)
    assert mode(tmp_path / "secret_key") == 0o600


def test_the_join_token_file_is_private_from_its_first_byte(tmp_path, no_chmod, monkeypatch):
    monkeypatch.delenv("LLMGW_JOIN_TOKEN", raising=False)
    monkeypatch.delenv("LLMGW_JOIN_TOKEN_FILE", raising=False)
    stack = Stack(tmp_path)
    assert mode(Path(stack.env["LLMGW_JOIN_TOKEN_FILE"])) == 0o600


def test_a_secret_replacing_an_open_file_narrows_it_before_writing(tmp_path):
    old = tmp_path / "admin-password"
    old.write_text("admin old\n")
    old.chmod(0o644)
    write_private(old, "admin new\n")
    assert mode(old) == 0o600
    assert old.read_text() == "admin new\n"


def test_a_link_planted_where_a_secret_goes_is_not_followed(tmp_path):
    elsewhere = tmp_path / "public"
    elsewhere.write_text("")
    (tmp_path / "secret").symlink_to(elsewhere)
    with pytest.raises(OSError):
        write_private(tmp_path / "secret", "s3cret")
    assert elsewhere.read_text() == ""
