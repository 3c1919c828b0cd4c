"""An old heartbeat never wins: a body older than one already received from the same agent run changes nothing.

Heartbeats carry the agent run's boot id and a sequence number that grows
within the run. The bodies below are built as JSON by hand, as a replaying
proxy or attacker would send them, so that what they test holds whatever
the wire types say.
"""

from __future__ import annotations

import msgspec
import pytest

from agent import config as agent_config
from agent import protocol
from agent.client import Rejected
from agent.loop import Agent
from devstack.faults import redis_unreachable
from inventory.models import Node
from inventory.registration import ReplayedInventory, upsert_inventory
from livestate import keys, loadstore
from tests.agentapi import JOIN_TOKEN, a_load, heartbeat, register, reply_of
from tests.factories import make_inventory
from tests.metrics_scrape import TEXT, body, of, samples

pytestmark = pytest.mark.django_db

BOOT = "0f1e2d3c4b5a69788796a5b4c3d2e1f0"


@pytest.fixture(autouse=True)
def _join_token(settings, redis_client):
    settings.LLMGW_JOIN_TOKEN = JOIN_TOKEN


@pytest.fixture
def token(client):
    return register(client, "gpu-1", gpus=8)


def a_body(seq: int, boot: str = BOOT, hostname: str = "", gpus: int = 0, cpu: float = 10.0) -> bytes:
    """A heartbeat's JSON; with a hostname, it carries an inventory of that host with that many GPUs."""
    message = {"boot_id": boot, "seq": seq, "load": msgspec.to_builtins(a_load(cpu))}
    if hostname:
        message["inventory"] = msgspec.to_builtins(make_inventory(hostname, gpus=gpus))
        message["inventory_hash"] = f"hash-of-{hostname}"
    return msgspec.json.encode(message)


def exported_cpu(client) -> float | None:
    scraped = samples(body(client.get("/metrics", headers={"Accept": TEXT})))
    return of(scraped, "llmgw_node_cpu_utilization_percent", node="gpu-1")


def what_the_node_is(client) -> tuple:
    node = Node.objects.get(pk="gpu-1")
    return node.hostname, node.inventory_hash, node.gpus.count(), loadstore.fetch(["gpu-1"])["gpu-1"].load.cpu_percent


def refused_as_replayed(response) -> None:
    assert response.status_code == 409, response.content
    assert protocol.decode(response.content, protocol.Rejection).field == "$.seq"


@pytest.mark.parametrize("cards", ["cached", "not cached"])
def test_replaying_an_older_body_after_a_newer_one_changes_nothing(client, token, redis_client, cards):
    old = a_body(1, hostname="old.example", gpus=8, cpu=10.0)
    reply_of(heartbeat(client, token, old))
    reply_of(heartbeat(client, token, a_body(2, hostname="new.example", gpus=2, cpu=20.0)))
    reply_of(heartbeat(client, token, a_body(3, cpu=30.0)))
    assert what_the_node_is(client) == ("new.example", "hash-of-new.example", 2, 30.0)
    if cards == "not cached":
        redis_client.delete(keys.card("gpu-1"))

    refused_as_replayed(heartbeat(client, token, old))
    # The same sequence number again is no newer either, with or without an inventory.
    refused_as_replayed(heartbeat(client, token, a_body(3, cpu=99.0)))
    refused_as_replayed(heartbeat(client, token, a_body(2, cpu=99.0)))

    assert what_the_node_is(client) == ("new.example", "hash-of-new.example", 2, 30.0)
    assert exported_cpu(client) == 30.0


def test_a_replayed_inventory_is_refused_by_the_database_too(client, token, settings):
    """While Redis is down the database path alone decides, from the sequence stored with the inventory."""
    old = a_body(1, hostname="old.example", gpus=8)
    with redis_unreachable(settings):
        reply_of(heartbeat(client, token, old))
        reply_of(heartbeat(client, token, a_body(2, hostname="new.example", gpus=2)))
        refused_as_replayed(heartbeat(client, token, old))
    node = Node.objects.get(pk="gpu-1")
    assert (node.hostname, node.gpus.count()) == ("new.example", 2)


def test_the_inventory_upsert_refuses_an_older_heartbeat_s_inventory(db):
    upsert_inventory("gpu-1", make_inventory("new.example", gpus=2), "h2", boot_id=BOOT, seq=5)
    with pytest.raises(ReplayedInventory):
        upsert_inventory("gpu-1", make_inventory("old.example", gpus=8), "h1", boot_id=BOOT, seq=4)
    assert Node.objects.get(pk="gpu-1").gpus.count() == 2
    # Another run's inventory, or one that says nothing of its run (an older agent), is taken.
    upsert_inventory("gpu-1", make_inventory("restarted.example", gpus=4), "h3", boot_id="another-run", seq=1)
    upsert_inventory("gpu-1", make_inventory("old-agent.example", gpus=1), "h4")
    assert Node.objects.get(pk="gpu-1").hostname == "old-agent.example"


def test_a_restarted_agent_starts_again_at_one(client, token):
    reply_of(heartbeat(client, token, a_body(41, cpu=41.0)))
    reply_of(heartbeat(client, token, a_body(1, boot="a-new-run", cpu=1.0)))
    reply_of(heartbeat(client, token, a_body(2, boot="a-new-run", hostname="rebuilt.example", gpus=4, cpu=2.0)))
    assert what_the_node_is(client) == ("rebuilt.example", "hash-of-rebuilt.example", 4, 2.0)
    refused_as_replayed(heartbeat(client, token, a_body(1, boot="a-new-run")))


def test_an_agent_that_sends_no_sequence_is_accepted_as_before(client, token):
    reply_of(heartbeat(client, token, a_body(7, cpu=7.0)))
    reply_of(heartbeat(client, token, protocol.Heartbeat(load=a_load(3.0))))
    reply_of(heartbeat(client, token, protocol.Heartbeat(load=a_load(4.0))))
    assert loadstore.fetch(["gpu-1"])["gpu-1"].load.cpu_percent == 4.0
    # And it does not reset the run it says nothing about.
    refused_as_replayed(heartbeat(client, token, a_body(7)))


def test_a_wrong_token_cannot_move_a_node_s_sequence(client, token):
    reply_of(heartbeat(client, token, a_body(5)))
    assert heartbeat(client, "gpu-1.wrong-secret", a_body(1_000_000)).status_code == 401
    reply_of(heartbeat(client, token, a_body(6)))


@pytest.mark.parametrize("field", ["seq", "boot_id"])
def test_a_bad_sequence_is_refused_naming_the_field(client, token, field):
    bad = {"seq": -1, "boot_id": "x" * 200}[field]
    response = heartbeat(client, token, msgspec.json.encode({"boot_id": BOOT, "seq": 1, field: bad}))
    assert response.status_code == 400
    assert protocol.decode(response.content, protocol.Rejection).field == f"$.{field}"


# -- the agent's side, against the real control plane over HTTP ------------------------------------


def an_agent(live_server, tmp_path) -> Agent:
    (tmp_path / "join-token").write_text(JOIN_TOKEN)
    config = agent_config.from_mapping(
        {
            "control_plane": live_server.url,
            "join_token_file": str(tmp_path / "join-token"),
            "state_dir": str(tmp_path / "state"),
            "node_id": "gpu-live",
            "engines": {},
        }
    )
    return Agent(config)


@pytest.mark.django_db(transaction=True)
def test_the_agent_numbers_its_heartbeats_and_tells_a_replay_apart(live_server, tmp_path, settings, redis_client):
    settings.LLMGW_JOIN_TOKEN = JOIN_TOKEN
    agent = an_agent(live_server, tmp_path)
    first, second = agent.heartbeat_message(None), agent.heartbeat_message(None)
    assert first.boot_id == second.boot_id != ""
    assert 0 < first.seq < second.seq
    agent.beat_once()
    sent = agent.heartbeat_message(a_load(5.0))
    agent.client.heartbeat(agent.token, sent)

    # The same body again, as a proxy retrying it would send it: the agent hears a refusal naming seq.
    with pytest.raises(Rejected) as refused:
        agent.client.heartbeat(agent.token, sent)
    assert (refused.value.status, refused.value.field) == (409, "$.seq")
    # It carries on: its next heartbeat is newer.
    agent.beat_once()

    # Restarted (a new process, the same state directory and token): a new run, accepted from its first beat.
    restarted = an_agent(live_server, tmp_path)
    assert restarted.heartbeat_message(None).boot_id != first.boot_id
    restarted.beat_once()
    restarted.beat_once()
