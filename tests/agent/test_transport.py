"""The agent and `llmgw` reach the control plane over HTTPS with its certificate verified (issue 22, item 2).

Whoever can write the control plane's reply can run anything on every node, so
plain `http://` is refused but to loopback, unless the config says so by name,
and the certificate is always checked: against the CA file the config names.
"""

from __future__ import annotations

import pytest

from agent import config as agent_config
from agent import protocol
from agent.client import ControlPlane, Unavailable
from devstack import tls
from devstack.fakecp import FakeControlPlane
from llmgw_transport import PLAIN_HTTP_REFUSED
from llmgwctl.client import UNREACHABLE, USAGE, Client, Failure


@pytest.fixture(scope="module")
def certificates(tmp_path_factory) -> tls.Tls:
    return tls.ensure(tmp_path_factory.mktemp("var"))


@pytest.fixture
def https_plane(certificates):
    with FakeControlPlane(certificate=certificates.proxy_pem) as plane:
        yield plane


def a_registration() -> protocol.Register:
    return protocol.Register(node_id="gpu-1", inventory=protocol.Inventory(hostname="gpu-1"), inventory_hash="h")


def config_of(tmp_path, text: str) -> agent_config.Config:
    path = tmp_path / "agent.yaml"
    path.write_text(text + "join_token: j\n")
    return agent_config.load(path)


@pytest.mark.parametrize("url", ["http://cp.example:8000", "http://10.0.0.5", "http://[2001:db8::1]:80"])
def test_the_agent_refuses_plain_http_to_a_host_other_than_loopback(tmp_path, url):
    with pytest.raises(agent_config.ConfigError) as error:
        config_of(tmp_path, f"control_plane: {url}\n")
    assert str(error.value) == f"control_plane: {PLAIN_HTTP_REFUSED}"


@pytest.mark.parametrize("url", ["http://127.0.0.1:8000", "http://localhost:8000", "http://[::1]:8000"])
def test_plain_http_to_loopback_is_for_local_use(tmp_path, url):
    assert config_of(tmp_path, f"control_plane: {url}\n").control_plane == url


def test_plain_http_elsewhere_only_where_the_config_says_so_by_name(tmp_path):
    config = config_of(tmp_path, "control_plane: http://cp.example:8000\nallow_insecure_http: true\n")
    assert config.allow_insecure_http


def test_a_ca_file_that_is_not_there_stops_the_agent(tmp_path):
    with pytest.raises(agent_config.ConfigError, match="ca_file: no such file"):
        config_of(tmp_path, f"control_plane: https://cp.example\nca_file: {tmp_path / 'missing.pem'}\n")


def test_the_agent_registers_over_https_trusting_the_ca_by_file(https_plane, certificates):
    registered = ControlPlane(https_plane.url, ca_file=str(certificates.ca)).register("join-secret", a_registration())
    assert registered.node_id == "gpu-1"


def test_the_agent_refuses_a_certificate_its_ca_did_not_sign(https_plane):
    # The system's CAs know nothing of this one: what a man in the middle's certificate looks like.
    with pytest.raises(Unavailable, match="SSLError"):
        ControlPlane(https_plane.url).register("join-secret", a_registration())
    assert not https_plane.registrations


def test_llmgw_refuses_plain_http_to_a_host_other_than_loopback():
    with pytest.raises(Failure) as refused:
        Client("http://llmgw.example.org", "llmgw-ops-token")
    assert refused.value.code == USAGE and "allow-insecure-http" in str(refused.value)
    Client("http://llmgw.example.org", "llmgw-ops-token", allow_insecure_http=True)
    Client("http://127.0.0.1:8000", "llmgw-ops-token")


def test_llmgw_verifies_the_certificate_against_its_ca_file(https_plane, certificates):
    with pytest.raises(Failure) as unverified:
        Client(https_plane.url, "t").get("/me/")
    assert unverified.value.code == UNREACHABLE and "SSLError" in str(unverified.value)
    with pytest.raises(Failure) as answered:
        Client(https_plane.url, "t", ca_file=str(certificates.ca)).get("/me/")
    # The TLS handshake passed: the stand-in, which is no operators' API, answered (501: it takes POSTs only).
    assert str(answered.value).startswith("501")
