"""deploy/haproxy.cfg as devstack fills it in: valid for HAProxy, and its limits agree with the agent API's."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from agent import protocol
from devstack import proxy

BACKENDS = [proxy.Backend("web", 18001, 3), proxy.Backend("web-1", 18002, 5)]


def rendered(tmp_path: Path) -> str:
    return proxy.render("127.0.0.1:18000", BACKENDS, tmp_path / "haproxy.sock")


def setting(text: str, name: str) -> int:
    (value,) = re.findall(rf"^\s*{re.escape(name)} (\d+)\s*$", text, re.M)
    return int(value)


def test_haproxy_accepts_the_filled_in_config(tmp_path):
    config = tmp_path / "haproxy.cfg"
    config.write_text(rendered(tmp_path))
    result = subprocess.run([proxy.haproxy_binary(), "-c", "-f", str(config)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_each_instance_is_a_server_taking_one_request_per_worker(tmp_path):
    servers = re.findall(r"^\s*server (\S+) (\S+) maxconn (\d+)$", rendered(tmp_path), re.M)
    assert servers == [("web", "127.0.0.1:18001", "3"), ("web-1", "127.0.0.1:18002", "5")]


def test_the_body_limit_is_the_agent_apis(tmp_path):
    text = rendered(tmp_path)
    assert f"req.hdr_val(content-length) gt {protocol.MAX_BODY_BYTES} }}" in text
    assert f"the body is larger than {protocol.MAX_BODY_BYTES} bytes" in text


def test_a_whole_body_and_its_headers_fit_in_one_buffer(tmp_path):
    # What http-buffer-request can hold: the buffer less the room kept for rewriting headers.
    text = rendered(tmp_path)
    usable = setting(text, "tune.bufsize") - setting(text, "tune.maxrewrite")
    assert usable >= protocol.MAX_BODY_BYTES + 16 * 1024


def test_a_placeholder_left_unfilled_is_an_error_not_a_default(tmp_path):
    with pytest.raises(ValueError, match="unfilled placeholder"):
        proxy.render("127.0.0.1:1", BACKENDS, tmp_path / "s", template="bind {{bind}}\ntimeout {{timeout}}\n")


def test_maxconn_is_the_fleets_where_descriptors_allow_and_what_fits_where_not(tmp_path, monkeypatch):
    monkeypatch.setattr(proxy.resource, "getrlimit", lambda which: (1024, 1_048_576))
    assert proxy.max_connections() == proxy.PRODUCTION_MAXCONN
    assert setting(rendered(tmp_path), "maxconn") == proxy.PRODUCTION_MAXCONN
    # Two descriptors per connection and some to spare: HAProxy would refuse to start with more.
    monkeypatch.setattr(proxy.resource, "getrlimit", lambda which: (1024, 20_000))
    assert 2 * proxy.max_connections() < 20_000
    assert proxy.max_connections() > 9_000
