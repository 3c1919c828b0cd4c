"""Tenants' limits held across several gateways: real HAProxy processes peered, real demo engines.

Each gateway counts its tenants in its own stick table and only there; HAProxy's `peers` replicate
every table to every gateway, and each gateway checks a limit against the sum. Requests per second
are the tables' `gpc0_rate`; requests in flight are the gateway's own `conn_cur` plus the others'
`gpt0`, which each gateway writes as requests start and its sync writes again as they end (peers do
not send conn_cur).
"""

from __future__ import annotations

import http.client
import json
import socket
import ssl
import subprocess
import time
from pathlib import Path

import pytest
import requests
from django.core.management import CommandError, call_command

from devstack.polling import wait_until
from devstack.ports import free_port
from devstack.proxy import haproxy_binary
from gateway import haproxy_config
from gateway.haproxy_config import Paths, Peer, Peering
from gateway.models import ApiKey, Tenant
from inventory.models import Shard
from tests.test_gateway import CHAT, Engine, Gateway, serve
from tests.test_gateway_limits import refused_for

pytestmark = [pytest.mark.slow, pytest.mark.django_db]

STREAM = {"model": "chat", "prompt": "x", "max_tokens": 500, "stream": True}


def peered(tmp_path: Path, names=("gw-a", "gw-b"), tls: tuple[str, str] = ("", "")) -> list[Gateway]:
    peers = tuple(Peer(name, f"127.0.0.1:{free_port()}") for name in names)
    return [Gateway(tmp_path / name, peering=Peering(name, peers, *tls)) for name in names]


@pytest.fixture
def gateways(tmp_path):
    made = peered(tmp_path)
    yield made
    for each in made:
        each.stop()


@pytest.fixture
def tenant(db) -> Tenant:
    return Tenant.objects.create(name="acme")


@pytest.fixture
def key(tenant) -> str:
    made = ApiKey(tenant=tenant)
    secret = made.issue()
    made.save()
    return secret


def serve_engine(gateways: list[Gateway]) -> Engine:
    """One demo engine behind the gateways; slow enough (20 ms a token) that streams stay in flight."""
    replica = serve("gw-1", 0)
    running = Engine(replica.deployment.engine_secret, cpu_ms_per_token=20)
    Shard.objects.filter(replica=replica).update(port=running.port)
    for each in gateways:
        each.program()
    return running


@pytest.fixture
def engine(gateways, db):
    running = serve_engine(gateways)
    yield running
    running.stop()


class Stream:
    """A streamed completion held open through a gateway until closed (its first event read: admitted)."""

    def __init__(self, gateway: Gateway, key: str):
        self.connection = http.client.HTTPConnection("127.0.0.1", gateway.port, timeout=10)
        self.connection.request("POST", "/v1/completions", json.dumps(STREAM), {"Authorization": f"Bearer {key}"})
        self.answer = self.connection.getresponse()
        assert self.answer.status == 200, self.answer.read()
        assert self.answer.readline().startswith(b"data: ")

    def close(self) -> None:
        self.connection.close()


def limit(gateways: list[Gateway], tenant: Tenant, **limits) -> None:
    Tenant.objects.filter(pk=tenant.pk).update(**limits)
    for each in gateways:
        each.sync.run_once()


def peers_up(gateways: list[Gateway]) -> bool:
    """Every gateway's peers' connections established (`show peers`: last_status=ESTA for each remote)."""
    for each in gateways:
        answer = each.sync.runtime.ask("show peers")
        remote = [line for line in answer.splitlines() if "(remote," in line]
        if len(remote) != len(gateways) - 1 or not all("last_status=ESTA" in line for line in remote):
            return False
    return True


def test_a_tenant_sending_through_two_gateways_alternately_gets_its_limit_in_total_not_twice(gateways, engine, key):
    limit(gateways, Tenant.objects.get(name="acme"), requests_per_second=5)
    wait_until(lambda: peers_up(gateways), 10, "the gateways to connect to each other")
    sessions = [requests.Session() for _ in gateways]
    admitted = {each.port: 0 for each in gateways}
    for index in range(20):
        each, session = gateways[index % 2], sessions[index % 2]
        answer = session.get(each.url("/v1/models"), headers={"Authorization": f"Bearer {key}"}, timeout=10)
        admitted[each.port] += answer.status_code == 200
        if answer.status_code != 200:
            assert refused_for(answer, "requests per second limit of 5")
    # Five in all, not five on each: each gateway saw the other's admissions. A request may overtake the
    # replication of the one before it on the other gateway (a fraction of a millisecond, sometimes a
    # few on a loaded machine): one or two too many is replication's delay, ten would be no sharing.
    assert 5 <= sum(admitted.values()) <= 7, admitted
    assert all(admitted.values()), admitted
    # Refused requests do not count: the next second lets the limit's worth through again, on either.
    wait_until(lambda: gateways[1].post("/v1/chat/completions", CHAT, key).status_code == 200, 3, "the rate to fall")


def test_streams_held_open_on_one_gateway_count_against_the_others_concurrency_limit(gateways, engine, tenant, key):
    a, b = gateways
    limit(gateways, tenant, concurrent_requests=2)
    wait_until(lambda: peers_up(gateways), 10, "the gateways to connect to each other")
    streams = [Stream(a, key) for _ in range(2)]
    assert refused_for(b.post("/v1/chat/completions", CHAT, key), "concurrent requests limit of 2")
    assert refused_for(a.post("/v1/chat/completions", CHAT, key), "concurrent requests limit of 2")
    # A stream ended on A frees its slot on A at once, and on B once A's sync has written its count again.
    streams[0].close()
    wait_until(lambda: a.sync.run_once() and b.post("/v1/chat/completions", CHAT, key).status_code == 200, 5, "B")
    # The other way: one stream on A and one on B fill the limit for both.
    on_b = Stream(b, key)
    assert refused_for(a.post("/v1/chat/completions", CHAT, key), "concurrent requests limit of 2")
    assert refused_for(b.post("/v1/chat/completions", CHAT, key), "concurrent requests limit of 2")
    on_b.close()
    streams[1].close()

    def both_free() -> bool:
        for each in gateways:
            each.sync.run_once()
        return all(each.post("/v1/chat/completions", CHAT, key).status_code == 200 for each in gateways)

    wait_until(both_free, 5, "both slots free on both gateways")
    # Nothing is left counted once every request has ended and each sync has passed: the published counts are none.
    for each in gateways:
        each.sync.run_once()
        assert each.sync.runtime.table_entries(each.frontend.tenants_table, "data.gpt0 gt 0") == {}


def test_a_stream_longer_than_the_tables_expiry_still_counts_on_the_other_gateway(tmp_path, tenant, key, monkeypatch):
    # Entries expire after 4 s here (60 s as shipped): a stream outlasting it must still count on B, as A's
    # sync writes its count again before B's copy of the entry would expire.
    monkeypatch.setattr(haproxy_config, "TENANTS_EXPIRE_S", 4)
    gateways = peered(tmp_path)
    try:
        a, b = gateways
        running = serve_engine(gateways)
        limit(gateways, tenant, concurrent_requests=1)
        wait_until(lambda: peers_up(gateways), 10, "the gateways to connect to each other")
        stream = Stream(a, key)
        deadline = time.monotonic() + 6
        while time.monotonic() < deadline:
            a.sync.run_once()
            assert refused_for(b.post("/v1/chat/completions", CHAT, key), "concurrent requests limit of 1")
            time.sleep(0.5)  # A's sync passes twice a second here (every second as shipped)
        stream.close()
        running.stop()
    finally:
        for each in gateways:
            each.stop()


def test_each_gateway_alone_still_serves_and_limits_while_the_other_is_down(gateways, engine, tenant, key):
    a, b = gateways
    limit(gateways, tenant, requests_per_second=3)
    b.stop()
    assert a.sync.run_once().errors == []
    with requests.Session() as session:
        session.headers["Authorization"] = f"Bearer {key}"
        codes = [session.get(a.url("/v1/models"), timeout=10).status_code for _ in range(6)]
    assert codes.count(200) == 3 and codes.count(429) == 3, codes
    # Back, B serves again, and with A its peer once more the two share the limit again.
    b.start()
    wait_until(lambda: peers_up(gateways), 10, "the gateways to connect to each other again")
    wait_until(lambda: b.post("/v1/chat/completions", CHAT, key).status_code == 200, 3, "B to serve")
    a.stop()
    assert b.sync.run_once().errors == []
    wait_until(lambda: b.post("/v1/chat/completions", CHAT, key).status_code == 200, 3, "B to serve alone")


def peer_session_without_certificate(gateway: Gateway, ca: Path) -> bool:
    """Whether a TLS client without a certificate gets an answer to a peers hello on the gateway's peers port."""
    assert gateway.frontend.peering is not None
    mine = next(p for p in gateway.frontend.peering.peers if p.name == gateway.frontend.peering.name)
    host, _, port = mine.address.rpartition(":")
    context = ssl.create_default_context(cafile=str(ca))
    context.check_hostname = False
    try:
        with socket.create_connection((host, int(port)), timeout=5) as raw, context.wrap_socket(raw) as tls:
            tls.sendall(b"HAProxyS 2.1\ngw-a\nintruder 1 1\n")
            return bool(tls.recv(100))
    except (ssl.SSLError, ConnectionError):
        return False


def test_tls_between_peers_with_certificates_from_one_ca(tmp_path, db, tenant, key):
    tls = tmp_path / "tls"
    tls.mkdir()

    def openssl(command: str) -> None:
        subprocess.run(["openssl", *command.split()], cwd=tls, check=True, capture_output=True)

    openssl("req -x509 -newkey rsa:2048 -nodes -days 1 -subj /CN=ca -keyout ca.key -out ca.pem")
    openssl("req -newkey rsa:2048 -nodes -subj /CN=gateway -keyout gw.key -out gw.csr")
    openssl("x509 -req -in gw.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 1 -out gw.crt")
    (tls / "gw.pem").write_bytes((tls / "gw.crt").read_bytes() + (tls / "gw.key").read_bytes())
    gateways = peered(tmp_path, tls=(str(tls / "gw.pem"), str(tls / "ca.pem")))
    try:
        wait_until(lambda: peers_up(gateways), 10, "the gateways to connect to each other over TLS")
        # The connecting side shows its transport: TLS, never plain.
        shown = "".join(each.sync.runtime.ask("show peers") for each in gateways)
        assert "xprt=SSL" in shown and "xprt=RAW" not in shown
        # Without a certificate from the CA, nobody gets a peer session (nor can push counters).
        assert not peer_session_without_certificate(gateways[0], tls / "ca.pem")
        limit(gateways, tenant, requests_per_second=2)
        headers = {"Authorization": f"Bearer {key}"}
        codes = [
            requests.get(gateways[i % 2].url("/v1/models"), headers=headers, timeout=10).status_code for i in range(6)
        ]
        assert codes.count(429) >= 3, codes
    finally:
        for each in gateways:
            each.stop()


def sync_options(tmp_path: Path, *extra: str) -> list[str]:
    return ["--dir", str(tmp_path / "gw"), "--bind", f"127.0.0.1:{free_port()}", "--render-only", *extra]


@pytest.mark.parametrize(
    ("extra", "named"),
    [
        (("--name", "gw-a", "--peer", "gw-a=127.0.0.1:10000", "--peer", "GW B=127.0.0.1:10001"), "--peer GW B"),
        (("--name", "gw-a", "--peer", "gw-a=127.0.0.1", "--peer", "gw-b=127.0.0.1:10001"), "--peer gw-a=127.0.0.1:"),
        (("--name", "gw-c", "--peer", "gw-a=127.0.0.1:10000", "--peer", "gw-b=127.0.0.1:10001"), "not among"),
        (("--name", "gw-a", "--peer", "gw-a=127.0.0.1:10000", "--peer", "gw-a=127.0.0.1:10001"), "one name"),
        (("--peer-cert", "/nonexistent.pem"), "need --peer"),
    ],
)
def test_bad_peers_are_refused_naming_the_flag(tmp_path, extra, named):
    with pytest.raises(CommandError, match=named):
        call_command("gateway_sync", *sync_options(tmp_path, *extra))


def test_the_sync_renders_a_peered_config_haproxy_accepts(tmp_path):
    peers = ("--peer", "gw-a=127.0.0.1:10000", "--peer", "gw-b=10.0.0.2:10000", "--peer", "gw-c=10.0.0.3:10000")
    call_command("gateway_sync", *sync_options(tmp_path, "--name", "gw-a", *peers))
    config = Paths(tmp_path / "gw").config
    text = config.read_text()
    assert "localpeer gw-a" in text and "track-sc0 var(txn.tenant) table st_tenants_gw-a" in text
    assert "table_gpc0_rate(st_tenants_gw-c),add(txn.rate_elsewhere)" in text
    checked = subprocess.run([haproxy_binary(), "-c", "-f", str(config)], capture_output=True, text=True)
    assert checked.returncode == 0, checked.stdout + checked.stderr
