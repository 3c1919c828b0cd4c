"""Settings come from the environment through strict helpers."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from llmgw_site.env import EnvError, env_bool, env_float, env_int, env_str

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize(("raw", "expected"), [("true", True), ("false", False), ("TRUE", True), ("", False)])
def test_env_bool_accepts_only_true_and_false(monkeypatch, raw, expected):
    monkeypatch.setenv("LLMGW_FLAG", raw)
    assert env_bool("LLMGW_FLAG", default=False) is expected


@pytest.mark.parametrize("raw", ["yes", "1", "on", "maybe"])
def test_env_bool_names_the_variable_when_it_refuses(monkeypatch, raw):
    monkeypatch.setenv("LLMGW_FLAG", raw)
    with pytest.raises(EnvError, match="LLMGW_FLAG"):
        env_bool("LLMGW_FLAG", default=False)


def test_env_int_and_float_refuse_garbage_naming_the_variable(monkeypatch):
    monkeypatch.setenv("LLMGW_N", "five")
    with pytest.raises(EnvError, match="LLMGW_N"):
        env_int("LLMGW_N", 1)
    with pytest.raises(EnvError, match="LLMGW_N"):
        env_float("LLMGW_N", 1.0)
    monkeypatch.setenv("LLMGW_N", "-3")
    with pytest.raises(EnvError, match="at least"):
        env_float("LLMGW_N", 1.0, minimum=0)


def test_env_float_refuses_a_value_above_its_maximum_naming_the_variable(monkeypatch):
    monkeypatch.setenv("LLMGW_SHARE", "1.5")
    with pytest.raises(EnvError, match="LLMGW_SHARE must be at most 1"):
        env_float("LLMGW_SHARE", 0.5, maximum=1.0)
    monkeypatch.setenv("LLMGW_SHARE", "1")
    assert env_float("LLMGW_SHARE", 0.5, maximum=1.0) == 1.0


def test_secret_may_come_from_a_file(monkeypatch, tmp_path):
    secret = tmp_path / "key"
    secret.write_text("from-the-file\n")
    monkeypatch.setenv("LLMGW_SECRET", "from-the-variable")
    monkeypatch.setenv("LLMGW_SECRET_FILE", str(secret))
    assert env_str("LLMGW_SECRET") == "from-the-file"


def test_secret_file_that_cannot_be_read_is_named(monkeypatch, tmp_path):
    monkeypatch.setenv("LLMGW_SECRET_FILE", str(tmp_path / "missing"))
    with pytest.raises(EnvError, match="LLMGW_SECRET_FILE"):
        env_str("LLMGW_SECRET")


def manage(*args: str, **env: str) -> subprocess.CompletedProcess:
    """manage.py with the site's own settings (not the tests'), as an operator's shell runs it."""
    clean = {k: v for k, v in os.environ.items() if k not in {"DEBUG", "SECRET_KEY", "ALLOWED_HOSTS", "DATABASE_URL"}}
    return subprocess.run(
        [sys.executable, str(ROOT / "manage.py"), *args],
        env={**clean, "DJANGO_SETTINGS_MODULE": "llmgw_site.settings", **env},
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
    )


def test_production_settings_refuse_to_start_without_secret_key(tmp_path):
    result = manage("check", DEBUG="false", ALLOWED_HOSTS="llmgw.example.com", LLMGW_VAR_DIR=str(tmp_path))
    assert result.returncode != 0
    assert "SECRET_KEY is required" in result.stderr


def test_production_settings_refuse_to_start_without_allowed_hosts(tmp_path):
    result = manage("check", DEBUG="false", SECRET_KEY="x" * 60, LLMGW_VAR_DIR=str(tmp_path))
    assert result.returncode != 0
    assert "ALLOWED_HOSTS is required" in result.stderr


def test_a_bad_boolean_stops_the_process_naming_it(tmp_path):
    result = manage("check", DEBUG="yes", LLMGW_VAR_DIR=str(tmp_path))
    assert result.returncode != 0
    assert "DEBUG must be true or false" in result.stderr


def test_check_deploy_is_clean_in_production_settings(tmp_path):
    result = manage(
        "check",
        "--deploy",
        "--fail-level",
        "WARNING",
        DEBUG="false",
        SECRET_KEY="k3y-" + "abcdefghij" * 6,
        ALLOWED_HOSTS="llmgw.example.com",
        LLMGW_VAR_DIR=str(tmp_path),
    )
    assert result.returncode == 0, result.stderr
    assert "no issues" in result.stdout


def test_database_url_switches_to_postgresql(tmp_path):
    code = "from django.conf import settings; print(settings.DATABASES['default']['ENGINE'])"
    result = subprocess.run(
        [sys.executable, "-c", f"import django, os; django.setup(); {code}"],
        env={
            **os.environ,
            "DJANGO_SETTINGS_MODULE": "llmgw_site.settings",
            "DATABASE_URL": "postgres://u@db.example:5432/llmgw",
            "LLMGW_VAR_DIR": str(tmp_path),
        },
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
    )
    assert result.stdout.strip() == "django.db.backends.postgresql", result.stderr


def test_env_example_lists_every_variable_settings_read():
    import re

    read = set(re.findall(r'env_\w+\("([A-Z_]+)"', (ROOT / "llmgw_site" / "settings.py").read_text()))
    assert "DATABASE_URL" in read
    listed = set(re.findall(r"^#?\s*([A-Z_]+)=", (ROOT / ".env.example").read_text(), re.MULTILINE))
    assert read - listed == set()


def test_with_debug_unset_the_settings_are_production_ones(tmp_path):
    """Issue 22, item 11: a forgotten DEBUG must not serve tracebacks; development asks for it by name."""
    refused = manage("check", LLMGW_VAR_DIR=str(tmp_path))
    assert refused.returncode != 0
    assert "SECRET_KEY is required when DEBUG is false" in refused.stderr
    code = "from django.conf import settings as s; print(s.DEBUG, s.SESSION_COOKIE_SECURE, s.LLMGW_REQUIRE_HTTPS)"
    shown = manage(
        "shell", "-c", code, SECRET_KEY="k" * 60, ALLOWED_HOSTS="llmgw.example.com", LLMGW_VAR_DIR=str(tmp_path)
    )
    assert shown.stdout.split()[-3:] == ["False", "True", "True"], shown.stderr
