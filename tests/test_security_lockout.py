"""Failed credentials from one address never lock out the valid ones from that address.

Behind a proxy (or a NAT) every agent shares one client address, so a limit on
refused credentials keyed by address alone would let anyone who can reach the
control plane refuse the whole fleet every minute. Here five healthy agents
share an address with an attacker, through the real views and the real Redis,
at the production limits.
"""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
import time_machine

import livestate
from agent import protocol
from inventory.liveness import mark_stale
from inventory.models import Liveness, Node
from tests.agentapi import JOIN_TOKEN, a_load, reply_of
from tests.factories import make_inventory

pytestmark = pytest.mark.django_db

# The start of a minute: every counter below lives in that minute's window.
T0 = 1_800_000_000.0
SHARED = "203.0.113.7"
AGENTS = [f"agent-{i}" for i in range(5)]


@pytest.fixture
def production_limits(settings, redis_client):
    settings.LLMGW_JOIN_TOKEN = JOIN_TOKEN
    settings.LLMGW_AUTH_FAILURES_PER_MINUTE = 30
    settings.LLMGW_REGISTER_PER_MINUTE = 20
    settings.LLMGW_HEARTBEAT_PER_MINUTE = 120
    settings.LLMGW_PROXY_HOPS = 0
    livestate.reset_client()
    with time_machine.travel(T0, tick=False) as traveller:
        yield traveller


def post(client, path: str, body: protocol.Struct, token: str, address: str = SHARED):
    return client.post(
        path,
        data=protocol.encode(body),
        content_type="application/json",
        headers={"Authorization": f"Bearer {token}"},
        REMOTE_ADDR=address,
    )


def from_shared(client, path: str, body: protocol.Struct, token: str):
    return post(client, path, body, token)


def register(client, node_id: str) -> str:
    message = protocol.Register(node_id=node_id, inventory=make_inventory(f"{node_id}.example"))
    response = from_shared(client, "/api/v1/register", message, JOIN_TOKEN)
    assert response.status_code == 200, response.content
    return protocol.decode(response.content, protocol.Registered).token


def attack(client, tokens: dict[str, str]) -> list[int]:
    """Thirty-one wrong join tokens and thirty-one wrong node tokens of each kind; the answers."""
    answers = []
    for i in range(31):
        intruder = protocol.Register(node_id=f"intruder-{i}", inventory=make_inventory("intruder.example"))
        answers.append(from_shared(client, "/api/v1/register", intruder, f"{JOIN_TOKEN}-guess-{i}").status_code)
    for i in range(31):
        # A known node's id with a wrong secret (checked against its cached card), and an unknown node.
        answers.append(from_shared(client, "/api/v1/heartbeat", protocol.Heartbeat(), f"agent-0.guess{i}").status_code)
        answers.append(from_shared(client, "/api/v1/heartbeat", protocol.Heartbeat(), f"ghost-{i}.guess").status_code)
    return answers


def test_an_attacker_at_the_agents_address_refuses_none_of_their_heartbeats(client, production_limits):
    tokens = {node_id: register(client, node_id) for node_id in AGENTS}
    for token in tokens.values():
        reply_of(from_shared(client, "/api/v1/heartbeat", protocol.Heartbeat(load=a_load()), token))

    answers = attack(client, tokens)
    # The attacker is refused, and past the budget told to go away for the minute.
    assert set(answers) == {401, 429}
    assert answers.count(429) > 0

    # For the rest of the minute the agents beat every five seconds: every beat is accepted.
    for _ in range(10):
        production_limits.shift(5)
        for node_id, token in tokens.items():
            response = from_shared(client, "/api/v1/heartbeat", protocol.Heartbeat(load=a_load()), token)
            assert response.status_code == 200, (node_id, response.content)
            assert reply_of(response).state == "ready"
    # So the sweep, 50 s after the attack began, finds every one of them alive.
    mark_stale(datetime.fromtimestamp(T0 + 50, UTC))
    assert set(Node.objects.filter(pk__in=AGENTS).values_list("liveness", flat=True)) == {Liveness.ALIVE}


def test_after_the_attack_a_valid_join_token_still_registers_from_that_address(client, production_limits):
    tokens = {node_id: register(client, node_id) for node_id in AGENTS}
    attack(client, tokens)
    # A new node joins, and an agent that lost its token registers again.
    new_token = register(client, "agent-new")
    again = register(client, "agent-1")
    for token in (new_token, again):
        reply_of(from_shared(client, "/api/v1/heartbeat", protocol.Heartbeat(), token))


def test_refused_join_tokens_do_not_spend_the_address_s_registrations(client, production_limits, settings):
    settings.LLMGW_REGISTER_PER_MINUTE = 3
    for i in range(10):
        intruder = protocol.Register(node_id=f"intruder-{i}")
        assert from_shared(client, "/api/v1/register", intruder, f"wrong-{i}").status_code in (401, 429)
    for node_id in AGENTS[:3]:
        register(client, node_id)
    # The limit itself still holds for registrations with the right token.
    refused = from_shared(client, "/api/v1/register", protocol.Register(node_id="agent-4"), JOIN_TOKEN)
    assert refused.status_code == 429
    assert protocol.decode(refused.content, protocol.Rejection).field == "rate"


def test_a_stranger_cannot_spend_a_node_s_heartbeat_budget(client, production_limits, settings):
    settings.LLMGW_HEARTBEAT_PER_MINUTE = 4
    token = register(client, "agent-0")
    secret = token.rpartition(".")[2]
    for i in range(10):
        # The node's id with wrong secrets, and a secret one character off.
        assert from_shared(client, "/api/v1/heartbeat", protocol.Heartbeat(), f"agent-0.x{i}").status_code in (401, 429)
    assert from_shared(client, "/api/v1/heartbeat", protocol.Heartbeat(), f"agent-0.{secret}x").status_code == 401
    answers = [from_shared(client, "/api/v1/heartbeat", protocol.Heartbeat(), token).status_code for _ in range(5)]
    assert answers == [200] * 4 + [429]


def test_past_the_budget_a_wrong_token_is_refused_for_the_minute_everywhere_it_is_checked(client, production_limits):
    token = register(client, "agent-0")
    reply_of(from_shared(client, "/api/v1/heartbeat", protocol.Heartbeat(), token))  # its card is cached
    for i in range(30):
        assert from_shared(client, "/api/v1/heartbeat", protocol.Heartbeat(), f"ghost.g{i}").status_code == 401
    for wrong in ("agent-0.wrong", "ghost.wrong", "not-a-token"):
        response = from_shared(client, "/api/v1/heartbeat", protocol.Heartbeat(), wrong)
        assert response.status_code == 429, wrong
        assert protocol.decode(response.content, protocol.Rejection).field == "authorization"
        assert 0 < int(response["Retry-After"]) <= 60
    response = from_shared(client, "/api/v1/register", protocol.Register(node_id="x"), "wrong")
    assert response.status_code == 429
    # Another address has its own budget.
    assert post(client, "/api/v1/heartbeat", protocol.Heartbeat(), "ghost.wrong", "10.0.0.9").status_code == 401
