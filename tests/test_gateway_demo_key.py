"""`make run`'s keys (the demo tenant's, the engines' scrape key): made once, private; the gateway renders alone."""

from __future__ import annotations

import shutil
import stat
import subprocess
from pathlib import Path

import pytest
from django.core.management import CommandError, call_command

from devstack.proxy import haproxy_binary
from devstack.stack import Stack
from gateway.models import ApiKey, key_digest


@pytest.mark.django_db
def test_the_demo_key_is_made_once_and_kept_private(tmp_path, capsys):
    path = tmp_path / "demo-api-key"
    call_command("ensure_demo_key", "--key-file", str(path))
    assert capsys.readouterr().out.startswith("created llmgw-sk-")
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    (key,) = ApiKey.objects.usable()
    assert key.digest == key_digest(path.read_text()) and key.tenant.name == "demo"
    call_command("ensure_demo_key", "--key-file", str(path))
    assert capsys.readouterr().out.strip() == "exists"
    assert ApiKey.objects.count() == 1


@pytest.mark.django_db
def test_render_only_writes_a_private_directory_haproxy_accepts(tmp_path):
    directory = tmp_path / "gw"
    call_command("gateway_sync", "--dir", str(directory), "--bind", "127.0.0.1:18099", "--render-only")
    assert stat.S_IMODE(directory.stat().st_mode) == 0o700
    assert stat.S_IMODE((directory / "gateway.cfg").stat().st_mode) == 0o600
    subprocess.run([haproxy_binary(), "-c", "-q", "-f", str(directory / "gateway.cfg")], check=True)


@pytest.mark.django_db
def test_the_request_timeout_is_rendered_where_haproxy_applies_it_and_bounded(tmp_path):
    directory = tmp_path / "gw"
    command = ["gateway_sync", "--dir", str(directory), "--bind", "127.0.0.1:18099", "--render-only"]
    call_command(*command, "--request-timeout", "5")
    config = (directory / "gateway.cfg").read_text()
    assert "timeout http-request 5s" in config and "wait-for-body time 5s" in config
    for wrong in ("0", "601"):
        with pytest.raises(CommandError, match="--request-timeout"):
            call_command(*command, "--request-timeout", wrong)


def test_the_stack_gives_prometheus_the_engines_scrape_key(tmp_path):
    stack = Stack(tmp_path, env={"LLMGW_ENGINE_SCRAPE_KEY": "", "LLMGW_ENGINE_SCRAPE_KEY_FILE": ""})
    key_file = Path(stack.env["LLMGW_ENGINE_SCRAPE_KEY_FILE"])
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600 and len(key_file.read_text()) >= 40
    part = stack.prometheus_part()
    if part is None:
        pytest.skip("prometheus is not installed")
    config = (tmp_path / "prometheus.yml").read_text()
    assert f"  - job_name: llmgw-engines\n    authorization:\n      credentials_file: {key_file}\n" in config
    promtool = shutil.which("promtool")
    if promtool:
        subprocess.run([promtool, "check", "config", str(tmp_path / "prometheus.yml")], check=True, capture_output=True)
