"""What `make run` starts is not open to whoever shares the machine or its network (issue 22, item 2).

HTTPS at the proxy, with a certificate from a CA the stack makes and an agent
trusts by file; plain HTTP on loopback only; a Redis of its own that asks for a
password; every key and password private from its first byte.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
import redis
import requests

from agent import protocol
from agent.client import ControlPlane
from devstack import tls
from devstack.ports import free_port
from devstack.stack import Stack

pytestmark = pytest.mark.slow


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_the_ca_and_the_proxys_key_are_private_from_the_first_byte(tmp_path, monkeypatch):
    # openssl writes the keys under umask 077: nothing narrows them afterwards, so nothing needs to.
    monkeypatch.setattr(os, "fchmod", lambda *a: None)
    made = tls.ensure(tmp_path)
    assert mode(made.directory) == 0o700
    assert {p.name: mode(p) for p in made.directory.iterdir()} == {"ca.pem": 0o600, "ca.key": 0o600, "proxy.pem": 0o600}
    assert tls.ensure(tmp_path).ca.read_bytes() == made.ca.read_bytes(), "made once, then kept"


@pytest.fixture(scope="module")
def stack(tmp_path_factory, redis_server):
    var = tmp_path_factory.mktemp("trust")
    stack = Stack(
        var,
        env={
            "DATABASE_URL": f"sqlite:///{var / 'llmgw.sqlite3'}",
            "REDIS_URL": redis_server if isinstance(redis_server, str) else redis_server.url,
        },
        web_port=free_port(),
        https_port=free_port(),
        workers=1,
    )
    try:
        stack.manage("migrate", "--noinput", "-v0")
        stack.start_web()
        yield stack
    finally:
        stack.stop_all()


def test_the_proxy_serves_https_with_a_certificate_of_the_stacks_own_ca(stack):
    ca = str(tls.ensure(stack.var).ca)
    assert requests.get(f"{stack.https_url}/healthz", verify=ca, timeout=10).status_code == 200
    with pytest.raises(requests.exceptions.SSLError):
        requests.get(f"{stack.https_url}/healthz", verify=True, timeout=10)


def test_plain_http_is_served_on_loopback_only(stack):
    config = (stack.var / "haproxy.cfg").read_text()
    binds = [line.split()[1:] for line in config.splitlines() if line.strip().startswith("bind ")]
    plain = [words for words in binds if "ssl" not in words]
    assert plain == [[f"127.0.0.1:{stack.web_port}"]]
    assert requests.get(f"http://127.0.0.1:{stack.web_port}/healthz", timeout=10).status_code == 200


def test_an_agent_trusting_the_ca_by_file_registers_through_the_proxy(stack):
    join_token = Path(stack.env["LLMGW_JOIN_TOKEN_FILE"]).read_text()
    client = ControlPlane(stack.https_url, ca_file=str(tls.ensure(stack.var).ca))
    message = protocol.Register(node_id="tls-1", inventory=protocol.Inventory(hostname="tls-1"), inventory_hash="h")
    assert client.register(join_token, message).node_id == "tls-1"


def test_a_redis_the_stack_starts_asks_for_a_password_kept_private(tmp_path):
    port = free_port()
    stack = Stack(tmp_path, env={"REDIS_URL": f"redis://127.0.0.1:{port}/0"}, redis_password=True)
    part = stack.redis_part()
    stack.start(part)
    try:
        password = (tmp_path / "redis-password").read_text()
        assert password not in " ".join(part.command), "ps shows a command line to every user"
        assert mode(tmp_path / "redis-password") == mode(tmp_path / "redis.conf") == 0o600
        with pytest.raises(redis.exceptions.AuthenticationError):
            redis.Redis(port=port).ping()
        assert password in stack.env["REDIS_URL"]
        assert redis.Redis.from_url(stack.env["REDIS_URL"]).ping()
    finally:
        stack.stop_all()
