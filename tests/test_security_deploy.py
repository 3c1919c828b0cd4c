"""The production environment docs/operations.md gives passes `manage.py check --deploy` as written."""

from __future__ import annotations

import re
from pathlib import Path

from tests.test_settings import manage

ROOT = Path(__file__).resolve().parent.parent


def documented_environment() -> dict[str, str]:
    text = (ROOT / "docs" / "operations.md").read_text()
    block = re.search(r"The environment for the web and Celery processes:\s*```sh\n(.*?)```", text, re.DOTALL)
    assert block, "docs/operations.md lost its production environment block"
    pairs = re.findall(r"^([A-Z_]+)=(\S+)", block.group(1), re.MULTILINE)
    return dict(pairs)


def test_the_documented_production_environment_passes_check_deploy(tmp_path):
    env = documented_environment()
    assert env["DEBUG"] == "false"
    # The secrets are files in production; make them here with values of the right shape.
    for name, path in list(env.items()):
        if name.endswith("_FILE"):
            secret = tmp_path / Path(path).name
            secret.write_text("k3y-" + "abcdefghij" * 6 + "\n")
            env[name] = str(secret)
    result = manage("check", "--deploy", "--fail-level", "WARNING", LLMGW_VAR_DIR=str(tmp_path), **env)
    assert result.returncode == 0, result.stderr
    assert "no issues" in result.stdout


def test_production_settings_turn_on_every_transport_protection(tmp_path):
    env = documented_environment()
    env["SECRET_KEY"] = "k3y-" + "abcdefghij" * 6
    env = {k: v for k, v in env.items() if not k.endswith("_FILE")}
    code = (
        "from django.conf import settings as s; "
        "print(s.SESSION_COOKIE_SECURE, s.CSRF_COOKIE_SECURE, s.SECURE_SSL_REDIRECT, s.SECURE_HSTS_SECONDS > 0, "
        "s.SECURE_PROXY_SSL_HEADER, s.X_FRAME_OPTIONS, s.SECURE_CONTENT_TYPE_NOSNIFF)"
    )
    result = manage("shell", "-c", code, LLMGW_VAR_DIR=str(tmp_path), **env)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().splitlines()[-1].split() == [
        "True",
        "True",
        "True",
        "True",
        "('HTTP_X_FORWARDED_PROTO',",
        "'https')",
        "DENY",
        "True",
    ]
