"""A node cannot choose what Prometheus scrapes: engine targets are built from addresses the control plane trusts.

Those are the address a node's registrations and inventories arrived from, and
a claimed management address inside LLMGW_TRUSTED_TARGET_NETWORKS. Nodes
register and report through the real views here, from the addresses the test
client says they came from.
"""

from __future__ import annotations

from ipaddress import ip_network

import pytest

from agent import protocol
from inventory.desired import orders
from inventory.reconcile import reconcile
from inventory.registration import upsert_inventory
from tests.agentapi import JOIN_TOKEN, reply_of
from tests.factories import deployment, make_inventory

pytestmark = pytest.mark.django_db

TARGETS = "/api/v1/prometheus/targets"


@pytest.fixture(autouse=True)
def _join_token(settings, redis_client):
    settings.LLMGW_JOIN_TOKEN = JOIN_TOKEN
    settings.LLMGW_TRUSTED_TARGET_NETWORKS = ()
    settings.LLMGW_PROXY_HOPS = 0


def register_from(client, address: str, mgmt_addr: str, hostname: str = "evil.example") -> str:
    inventory = make_inventory(hostname, gpus=1, mgmt_addr=mgmt_addr)
    message = protocol.Register(node_id="gpu-1", inventory=inventory, inventory_hash="h1")
    response = post(client, "/api/v1/register", message, JOIN_TOKEN, address=address)
    assert response.status_code == 200, response.content
    return protocol.decode(response.content, protocol.Registered).token


def targets_of_a_running_engine(client) -> list[str]:
    """Place one engine on the node, let its agent report it running on port 9400, and read the targets."""
    deployment(gpus_per_shard=1)
    reconcile()
    (spec,) = orders("gpu-1").shards
    orders("gpu-1", [protocol.ShardStatus(shard=spec.shard, state="running", metrics_port=9400)])
    return [target for group in client.get(TARGETS).json() for target in group["targets"]]


def post(client, path: str, body: protocol.Struct, token: str, address: str = "127.0.0.1", **headers):
    return client.post(
        path,
        data=protocol.encode(body),
        content_type="application/json",
        headers={"Authorization": f"Bearer {token}", **headers},
        REMOTE_ADDR=address,
    )


@pytest.mark.parametrize("claimed", ["10.9.9.9", "evil.example", ""])
def test_a_claimed_address_is_not_scraped_the_address_the_node_beats_from_is(client, claimed):
    register_from(client, "127.0.0.1", claimed)
    assert targets_of_a_running_engine(client) == ["127.0.0.1:9400"]


def test_a_claimed_address_inside_an_approved_network_is_scraped(client, settings):
    settings.LLMGW_TRUSTED_TARGET_NETWORKS = (ip_network("10.0.0.0/8"),)
    register_from(client, "127.0.0.1", "10.9.9.9")
    assert targets_of_a_running_engine(client) == ["10.9.9.9:9400"]


def test_a_claimed_address_outside_the_approved_networks_is_not(client, settings):
    settings.LLMGW_TRUSTED_TARGET_NETWORKS = (ip_network("192.168.0.0/16"),)
    register_from(client, "127.0.0.1", "10.9.9.9")
    assert targets_of_a_running_engine(client) == ["127.0.0.1:9400"]


def test_a_new_inventory_records_the_address_it_came_from(client):
    token = register_from(client, "127.0.0.1", "10.9.9.9")
    moved = protocol.Heartbeat(
        inventory=make_inventory("moved.example", gpus=1, mgmt_addr="10.9.9.9"), inventory_hash="h2"
    )
    response = post(client, "/api/v1/heartbeat", moved, token, address="192.0.2.44")
    reply_of(response)
    # An ordinary heartbeat from elsewhere moves nothing: only an inventory (or a registration) says where the node is.
    reply_of(post(client, "/api/v1/heartbeat", protocol.Heartbeat(), token, address="198.51.100.1"))
    assert targets_of_a_running_engine(client) == ["192.0.2.44:9400"]


def test_behind_a_proxy_the_forwarded_address_is_the_node_s(client, settings):
    settings.LLMGW_PROXY_HOPS = 1
    inventory = make_inventory("evil.example", gpus=1, mgmt_addr="10.9.9.9")
    message = protocol.Register(node_id="gpu-1", inventory=inventory)
    response = post(
        client, "/api/v1/register", message, JOIN_TOKEN, address="127.0.0.1", **{"X-Forwarded-For": "192.0.2.9"}
    )
    assert response.status_code == 200
    assert targets_of_a_running_engine(client) == ["192.0.2.9:9400"]


def test_an_ipv6_source_address_is_bracketed(client):
    register_from(client, "2001:db8::7", "10.9.9.9")
    assert targets_of_a_running_engine(client) == ["[2001:db8::7]:9400"]


def test_a_node_with_no_trusted_address_has_no_target(client, db):
    """A node recorded without a source address (before this was kept) claims 10.9.9.9: nothing is scraped."""
    upsert_inventory("gpu-1", make_inventory("evil.example", gpus=1, mgmt_addr="10.9.9.9"))
    assert targets_of_a_running_engine(client) == []


def test_the_setting_refuses_a_network_that_is_not_one():
    from llmgw_site.env import EnvError, env_networks

    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("LLMGW_TRUSTED_TARGET_NETWORKS", "10.0.0.0/8, fd00::/8")
        assert env_networks("LLMGW_TRUSTED_TARGET_NETWORKS") == (ip_network("10.0.0.0/8"), ip_network("fd00::/8"))
        patch.setenv("LLMGW_TRUSTED_TARGET_NETWORKS", "10.0.0.0/8, evil.example")
        with pytest.raises(EnvError, match="LLMGW_TRUSTED_TARGET_NETWORKS"):
            env_networks("LLMGW_TRUSTED_TARGET_NETWORKS")
