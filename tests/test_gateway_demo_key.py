"""`make run`'s demo key: made once, private from its creation; the files render without a database."""

from __future__ import annotations

import stat
import subprocess

import pytest
from django.core.management import call_command

from devstack.proxy import haproxy_binary
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
