"""A node cannot name the address others connect to (issue 22).

Shard 0's claimed `mgmt_addr` became the other shards' `--dist-init-addr` and
LLMGW_LEADER, and the endpoint the pages show: a node beating from 10.0.0.5 that
claims `evil.attacker.example` made its peers connect there. Every use of a
node's address now goes through inventory/endpoints.py `trusted_address`. The
nodes register through the real view, from the address the test client gives.
"""

from __future__ import annotations

import pytest

from agent import protocol
from inventory.desired import orders
from inventory.models import Node, Replica, Shard
from inventory.reconcile import reconcile
from livestate import shardversion
from tests.agentapi import JOIN_TOKEN
from tests.factories import deployment, make_inventory
from tests.opsapi_support import Caller, make_token

pytestmark = pytest.mark.django_db

EVIL = "evil.attacker.example"
HTMX = {"HTTP_HX_REQUEST": "true"}


@pytest.fixture(autouse=True)
def _settings(settings, redis_client):
    settings.LLMGW_JOIN_TOKEN = JOIN_TOKEN
    settings.LLMGW_TRUSTED_TARGET_NETWORKS = ()
    settings.LLMGW_PROXY_HOPS = 0


def register_from(client, node_id: str, address: str, claimed: str) -> None:
    inventory = make_inventory(
        f"{node_id}.example", gpus=8, mgmt_addr=claimed, fabrics=[protocol.Fabric(name="ib-a", hcas=["mlx5_0"])]
    )
    message = protocol.Register(node_id=node_id, inventory=inventory, inventory_hash="h1")
    response = client.post(
        "/api/v1/register",
        data=protocol.encode(message),
        content_type="application/json",
        headers={"Authorization": f"Bearer {JOIN_TOKEN}"},
        REMOTE_ADDR=address,
    )
    assert response.status_code == 200, response.content


@pytest.fixture
def two_node_replica(client):
    """A replica across two nodes, its shard 0 on the node that beats from 10.0.0.5 and claims EVIL."""
    register_from(client, "a", "10.0.0.5", EVIL)
    register_from(client, "b", "10.0.0.6", "10.0.0.6")
    # SGLang: its shards take the leader on the command line (--dist-init-addr) as well as in LLMGW_LEADER.
    deployment(engine="sglang", shards_per_replica=2, gpus_per_shard=8)
    reconcile()
    leader = Shard.objects.get(index=0)
    assert leader.node_id == "a", "placement order is by node id"
    return leader


def test_the_other_shards_join_shard_0_at_its_source_address_not_its_claim(two_node_replica):
    (spec,) = orders("b").shards
    where = f"10.0.0.5:{two_node_replica.port}"
    assert spec.env["LLMGW_LEADER"] == where
    assert spec.command[spec.command.index("--dist-init-addr") + 1] == where
    assert EVIL not in " ".join([*spec.command, *spec.env.values()])


def test_a_shard_0_with_no_trusted_address_gives_no_leader_rather_than_its_claim(two_node_replica):
    # A node recorded before source addresses were kept has only its claim.
    Node.objects.filter(pk="a").update(source_addr=None)
    shardversion.bump(["b"])
    (spec,) = orders("b").shards
    assert "LLMGW_LEADER" not in spec.env
    assert EVIL not in " ".join([*spec.command, *spec.env.values()])


def test_the_node_page_and_the_admin_show_the_trusted_endpoint(client, operator, two_node_replica):
    (spec,) = orders("a").shards
    orders("a", [protocol.ShardStatus(shard=spec.shard, state="running", metrics_port=spec.port)])
    client.force_login(operator)

    page = client.get("/nodes/a/").content.decode()
    live = client.get("/nodes/a/", **HTMX).content.decode()
    replica = client.get(f"/admin/inventory/replica/{Replica.objects.get().pk}/change/").content.decode()

    endpoint = f"http://10.0.0.5:{two_node_replica.port}/v1"
    assert endpoint in live and endpoint in replica
    assert f"http://{EVIL}" not in page + live + replica
    # The claim is shown for what it is.
    assert "its agent claims" in page and EVIL in page


def test_the_operators_api_gives_the_trusted_address_beside_the_claim(client, viewer, two_node_replica):
    _, secret = make_token(viewer)
    detail = Caller(client, secret).get("/nodes/a/").json()
    assert (detail["address"], detail["mgmt_addr"]) == ("10.0.0.5", EVIL)
