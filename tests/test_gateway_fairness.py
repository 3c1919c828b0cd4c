"""Fair under pressure: a saturated model serves the tenant under its fair share first, and refuses the flood.

A real HAProxy (deploy/gateway.cfg) programmed by the real sync from the real database, in
front of a demo engine with one slot, and a deployment whose replicas take one request at a
time from the gateway (`max_in_flight_per_replica` 1). Every request is a long stream, held
until the test cuts it: one is served at a time, so which one starts next is the order of
service, observed without a sleep.
"""

from __future__ import annotations

import json
import socket

import pytest

from devstack.polling import wait_until
from gateway import fairness
from gateway.haproxy_config import Backend, Desired, Server, ServerState
from gateway.models import ApiKey, Tenant
from gateway.runtime import Runtime
from inventory.models import Deployment, Shard
from tests.test_gateway import Engine, Gateway, serve

pytestmark = pytest.mark.slow

# 1,000 tokens 50 ms apart: nearly a minute, far longer than the test holds one.
LONG = {
    "model": "chat",
    "messages": [{"role": "user", "content": "Tell a long story."}],
    "max_tokens": 1000,
    "stream": True,
}


def issue(tenant: str) -> str:
    made = ApiKey(tenant=Tenant.objects.create(name=tenant))
    secret = made.issue()
    made.save()
    return secret


class Held:
    """A stream on a socket of its own, read only when asked (never blocking), cut when the test says."""

    def __init__(self, port: int, key: str, body: dict = LONG):
        self.sock = socket.create_connection(("127.0.0.1", port))
        data = json.dumps(body).encode()
        self.sock.sendall(
            (
                f"POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\nAuthorization: Bearer {key}\r\n"
                f"Content-Type: application/json\r\nContent-Length: {len(data)}\r\n\r\n"
            ).encode()
            + data
        )
        self.sock.setblocking(False)
        self.received = b""
        self.closed = False

    def started(self) -> bool:
        """Its first token has arrived: the engine is serving it."""
        try:
            while chunk := self.sock.recv(65536):
                self.received += chunk
        except BlockingIOError:
            pass
        return b"data: " in self.received

    def cut(self) -> None:
        self.sock.close()
        self.closed = True


def queued(gateway: Gateway) -> int:
    """Requests waiting in m_chat's queue (backend and servers): HAProxy's `show stat` qcur of the backend."""
    lines = Runtime(gateway.paths.admin_socket).ask("show stat").splitlines()
    columns = lines[0][2:].split(",")
    for line in lines[1:]:
        f = line.split(",")
        if f[0] == "m_chat" and f[1] == "BACKEND":
            return int(f[columns.index("qcur")])
    raise AssertionError("no m_chat backend")


@pytest.mark.django_db
def test_the_light_tenants_queued_request_is_served_before_the_floods_and_the_flood_is_refused(tmp_path):
    flood, light = issue("flood"), issue("light")
    replica = serve("gw-1", 0)
    Deployment.objects.filter(pk=replica.deployment_id).update(max_in_flight_per_replica=1)
    engine = Engine(replica.deployment.engine_secret, 0.1, "--max-running", "1", "--ms-between-tokens", "50")
    Shard.objects.filter(replica=replica).update(port=engine.port)
    gateway = Gateway(tmp_path / "gw")
    held: list[Held] = []
    try:
        gateway.program()
        assert Runtime(gateway.paths.admin_socket).server_limits() == {("m_chat", replica.replica_id): 1}
        assert f"server {replica.replica_id} 127.0.0.1:{engine.port} weight 100 maxconn 1" in (
            gateway.paths.config.read_text()
        )
        # The flood: one served, one waiting in the gateway's queue (none at the engine: it gets one at a time).
        a1 = Held(gateway.port, flood)
        held.append(a1)
        wait_until(a1.started, 10, "the flood's first stream to start")
        a2 = Held(gateway.port, flood)
        held.append(a2)
        wait_until(lambda: queued(gateway) == 1, 10, "the flood's second request queued")
        # The sync's pass: the flood alone asks 2 of a capacity of 1, so its share is 1, refused once 1 waits.
        done = gateway.program()
        assert gateway.sync.runtime.map_entries(gateway.paths.fair_map) == {"m_chat": "1:1"}, done
        # At its share with a round's worth queued: a third is refused at once, and says why.
        refused = gateway.post("/v1/chat/completions", {**LONG, "stream": False}, flood)
        assert refused.status_code == 429, refused.text
        assert refused.headers["Retry-After"] == "1"
        error = refused.json()["error"]
        assert error["code"] == "rate_limit_exceeded"
        assert error["message"] == (
            "Model chat is saturated: tenant flood already has 2 requests on it and its fair share is 1; retry after 1s"
        )
        # The light tenant, under its share, is not refused: it waits, last to arrive.
        b1 = Held(gateway.port, light)
        held.append(b1)
        wait_until(lambda: queued(gateway) == 2, 10, "the light tenant's request queued")
        assert not a2.started() and not b1.started()
        # A stream cut frees the slot for exactly one more: the light tenant's, then the flood's.
        a1.cut()
        wait_until(lambda: b1.started() or a2.started(), 10, "the next request to be served")
        assert (b1.started(), a2.started()) == (True, False)
        b1.cut()
        wait_until(a2.started, 10, "the flood's queued request to be served")
        a2.cut()
        wait_until(lambda: queued(gateway) == 0, 10, "the queue to empty")
        # The flood was refused in the last 10 s: it counts as wanting more than any share.
        assert fairness.demands(gateway.sync.runtime.ask(fairness.command())) == {
            "m_chat": {"flood": fairness.UNBOUNDED}
        }
        # The limit lifted: maxconn 0 at run time, no fair share (the rules stand aside).
        Deployment.objects.filter(pk=replica.deployment_id).update(max_in_flight_per_replica=None)
        done = gateway.program()
        assert f"set maxconn server m_chat/{replica.replica_id} 0" in done.actions
        assert gateway.sync.runtime.map_entries(gateway.paths.fair_map) == {}
        assert not done.reloaded
    finally:
        for h in held:
            h.cut()
        gateway.stop()
        engine.stop()


def test_the_fair_share_is_max_min():
    # Everyone fits: nobody is over; a light tenant keeps its 2 and the flood gets the rest; two floods split.
    assert fairness.fair_share(16, [2, 3]) == 16
    assert fairness.fair_share(16, [2, 64]) == 14
    assert fairness.fair_share(16, [64, 64]) == 8
    assert fairness.fair_share(16, [1, 2, 40, 64]) == 6
    assert fairness.fair_share(1, [4, 1]) == 1
    assert fairness.fair_share(4, []) == 4


def test_the_shares_come_from_the_table_and_only_for_limited_models_with_ready_servers():
    table = (
        "# table: st_fair, type: string, size:102400, used:4\n"
        "0x55d0: key=m_chat/acme use=4 exp=59979 gpc0_rate(10000)=0 conn_cur=40\n"
        "0x55d1: key=m_chat/beta use=1 exp=59979 gpc0_rate(10000)=0 conn_cur=2\n"
        "0x55d2: key=m_code:v2/acme use=0 exp=1200 gpc0_rate(10000)=0 conn_cur=0\n"
        "0x55d3: key=m_code:v2/flood use=0 exp=1200 gpc0_rate(10000)=7 conn_cur=3\n"
    )
    asked = fairness.demands(table)
    assert asked == {"m_chat": {"acme": 40, "beta": 2}, "m_code:v2": {"flood": fairness.UNBOUNDED}}
    limited = (Server("r1", "127.0.0.1", 1, maxconn=4), Server("r2", "127.0.0.1", 2, maxconn=4))
    desired = Desired(
        backends={
            "chat": Backend("chat", "s", limited),
            "code:v2": Backend("code:v2", "s", (Server("r3", "127.0.0.1", 3),)),
            "draining": Backend("draining", "s", (Server("r4", "127.0.0.1", 4, state=ServerState.DRAIN, maxconn=2),)),
        }
    )
    # The flood wants more than is left beside the light tenant: refused at its share at once (bound 0).
    assert fairness.shares(desired, asked) == {"m_chat": "6:0"}
    # Alone, or everyone fitting: the whole capacity, refused only once a round of it waits.
    assert fairness.shares(desired, {"m_chat": {"acme": 40}}) == {"m_chat": "8:8"}
    assert fairness.shares(desired, {"m_chat": {"acme": 3, "beta": 2}}) == {"m_chat": "8:8"}


def test_a_tenants_demand_is_its_most_over_the_last_passes():
    recent = fairness.Recent(passes=2)
    assert recent.add({"m_chat": {"light": 2}}) == {"m_chat": {"light": 2}}
    assert recent.add({"m_chat": {"light": 1, "flood": 9}}) == {"m_chat": {"light": 2, "flood": 9}}
    assert recent.add({}) == {"m_chat": {"light": 1, "flood": 9}}
    assert recent.add({}) == {}
