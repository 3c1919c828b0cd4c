"""Id patterns match whole strings: a trailing newline is not part of any id.

In Python's `re`, `$` also matches just before a final newline, so a pattern ending
in `$` let "victim-1\\n" register; its pages then failed to reverse their own URLs
and its link in a browser opened the real victim-1's page.
"""

from __future__ import annotations

import json
import re
import typing

import pytest
from django.core.exceptions import ValidationError

from agent import config as agent_config
from agent import protocol
from inventory.models import Node
from inventory.models.deployments import NAME_VALIDATOR
from tests.agentapi import JOIN_TOKEN, a_load, post, register
from tests.factories import make_inventory

pytestmark = pytest.mark.django_db


def protocol_patterns() -> dict[str, str]:
    """Every string pattern the wire protocol declares, by the alias that declares it."""
    found = {}
    for name, value in vars(protocol).items():
        if typing.get_origin(value) is typing.Annotated:
            for meta in value.__metadata__:
                if getattr(meta, "pattern", None):
                    found[name] = meta.pattern
    return found


def test_the_protocol_declares_the_patterns_checked_here():
    assert set(protocol_patterns()) == {"NodeId", "LabelKey", "GPUUuid"}


@pytest.mark.parametrize("name", sorted(protocol_patterns()))
def test_each_protocol_pattern_refuses_a_trailing_newline(name):
    pattern = protocol_patterns()[name]
    # msgspec applies a pattern with re.search, as here.
    assert re.search(pattern, "victim-1")
    assert not re.search(pattern, "victim-1\n")


@pytest.fixture(autouse=True)
def _join_token(settings, redis_client):
    settings.LLMGW_JOIN_TOKEN = JOIN_TOKEN


def rejected_field(response) -> str:
    assert response.status_code == 400, response.content
    return protocol.decode(response.content, protocol.Rejection).field


def test_a_registration_with_a_newline_in_the_node_id_is_refused(client):
    register(client, "victim-1")
    body = json.dumps({"node_id": "victim-1\n", "inventory": {"hostname": "evil"}}).encode()

    response = post(client, "/api/v1/register", body, JOIN_TOKEN)

    assert rejected_field(response) == "$.node_id"
    assert list(Node.objects.values_list("pk", flat=True)) == ["victim-1"]


def test_a_label_key_with_a_newline_is_refused(client):
    inventory = json.loads(protocol.encode(make_inventory("n.example")))
    inventory["labels"] = {"zone\n": "a"}
    body = json.dumps({"node_id": "node-1", "inventory": inventory}).encode()

    response = post(client, "/api/v1/register", body, JOIN_TOKEN)

    assert rejected_field(response) == "$.inventory.labels"
    assert not Node.objects.exists()


@pytest.mark.parametrize("where", ["shards", "load"])
def test_a_shard_id_with_a_newline_is_refused_in_a_heartbeat(client, where):
    token = register(client, "gpu-1")
    if where == "shards":
        beat = {"shards": [{"shard": "shard-a\n", "state": "running"}]}
        field = "$.shards[0].shard"
    else:
        beat = {"load": json.loads(protocol.encode(a_load()))}
        beat["load"]["shards"][0]["shard"] = "shard-a\n"
        field = "$.load.shards[0].shard"

    response = post(client, "/api/v1/heartbeat", json.dumps(beat).encode(), token)

    assert rejected_field(response) == field


def test_a_deployment_name_with_a_newline_is_refused():
    NAME_VALIDATOR("llama-8b")
    with pytest.raises(ValidationError):
        NAME_VALIDATOR("llama-8b\n")


def test_the_agent_refuses_a_newline_in_its_own_ids():
    assert agent_config.valid_id("shard-a")
    assert not agent_config.valid_id("shard-a\n")


def test_the_agent_refuses_a_newline_in_an_environment_variable_name():
    base = {"control_plane": "https://cp.example:8000", "join_token": "j"}
    agent_config.from_mapping({**base, "env": {"HF_HOME": "/models"}})
    with pytest.raises(agent_config.ConfigError, match="environment variable name"):
        agent_config.from_mapping({**base, "env": {"HF_HOME\n": "/models"}})


def test_a_node_page_for_an_id_with_a_newline_is_not_found(client, operator, cluster):
    client.force_login(operator)
    assert client.get("/nodes/ready-1%0A/").status_code == 404
