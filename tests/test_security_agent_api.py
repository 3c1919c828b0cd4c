"""The agent API from an attacker's side: every credential that must not work, timing, and the limits.

test_api_register.py and test_api_heartbeat.py test the credentials as the
agent uses them; here each wrong credential is tried on both endpoints, the
comparisons are checked to be constant-time, and the rate limits are run
through the real views.
"""

from __future__ import annotations

import ast
import hmac
from pathlib import Path

import pytest
import time_machine

import livestate
from agent import protocol
from inventory.models import Node
from livestate import keys, loadstore
from nodes.models import NodeToken
from tests.agentapi import JOIN_TOKEN, a_load, heartbeat, post, register, reply_of
from tests.factories import make_inventory

pytestmark = pytest.mark.django_db
ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(autouse=True)
def _join_token(settings, redis_client):
    settings.LLMGW_JOIN_TOKEN = JOIN_TOKEN


@pytest.fixture
def tokens(client):
    return {"gpu-1": register(client, "gpu-1", gpus=8), "gpu-2": register(client, "gpu-2", gpus=8)}


def post_from(client, address: str, path: str, message: protocol.Struct, token: str):
    return client.post(
        path,
        data=protocol.encode(message),
        content_type="application/json",
        headers={"Authorization": f"Bearer {token}"},
        REMOTE_ADDR=address,
    )


def a_registration(node_id: str = "intruder-1") -> protocol.Register:
    return protocol.Register(node_id=node_id, inventory=make_inventory("intruder.example"))


def wrong_heartbeat_tokens(tokens: dict[str, str]) -> dict[str, str | None]:
    mine, other = tokens["gpu-1"], tokens["gpu-2"]
    return {
        "missing": None,
        "empty": "",
        "garbage": "not-a-token",
        "the join token": JOIN_TOKEN,
        "unknown node": "gpu-9." + mine.rpartition(".")[2],
        "wrong secret": "gpu-1." + "A" * 43,
        "another node's secret": "gpu-1." + other.rpartition(".")[2],
        "my secret under another node's id": "gpu-2." + mine.rpartition(".")[2],
    }


@pytest.mark.parametrize("cards", ["not cached", "cached"])
def test_every_wrong_heartbeat_credential_is_refused_and_changes_nothing(client, tokens, redis_client, cards):
    if cards == "cached":
        # Each node's card is then in Redis, and the beat script compares the secrets itself.
        for token in tokens.values():
            reply_of(heartbeat(client, token, protocol.Heartbeat(load=a_load(1.0))))
    before = Node.objects.get(pk="gpu-1").hostname
    loads_before = loadstore.fetch(["gpu-1", "gpu-2", "gpu-9"])
    times_before = redis_client.hgetall(keys.HEARTBEATS)
    for name, token in wrong_heartbeat_tokens(tokens).items():
        inventory = protocol.Heartbeat(inventory=make_inventory("hijacked.example"), inventory_hash="x", load=a_load())
        ordinary = protocol.Heartbeat(load=a_load(99.0))
        for beat in (inventory, ordinary):
            response = (
                heartbeat(client, token, beat) if token is not None else post(client, "/api/v1/heartbeat", beat, None)
            )
            assert response.status_code == 401, name
            assert response["WWW-Authenticate"] == "Bearer", name
    assert Node.objects.get(pk="gpu-1").hostname == before
    assert loadstore.fetch(["gpu-1", "gpu-2", "gpu-9"]) == loads_before
    assert redis_client.hgetall(keys.HEARTBEATS) == times_before


def test_refusals_do_not_tell_an_unknown_node_from_a_wrong_secret(client, tokens):
    """No answer lets a guesser enumerate node ids: the body is the same for both."""
    unknown = heartbeat(client, "gpu-9." + "A" * 43, protocol.Heartbeat())
    wrong = heartbeat(client, "gpu-1." + "A" * 43, protocol.Heartbeat())
    assert unknown.status_code == wrong.status_code == 401
    assert unknown.content == wrong.content


@pytest.mark.parametrize("kind", ["missing", "wrong", "a node token", "revoked admin join token"])
def test_registration_refuses_every_wrong_join_token(client, tokens, operator, kind):
    from nodes.models import JoinToken

    token = {"missing": None, "wrong": JOIN_TOKEN + "x", "a node token": tokens["gpu-1"]}.get(kind)
    if kind == "revoked admin join token":
        join = JoinToken(name="rack 7")
        token = join.issue()
        join.save()
        join.revoke()
    response = post(client, "/api/v1/register", a_registration(), token)
    assert response.status_code == 401
    assert not Node.objects.filter(pk="intruder-1").exists()


@pytest.mark.parametrize("cards", ["not cached", "cached"])
def test_a_revoked_node_token_and_a_replaced_one_are_refused(client, tokens, cards):
    if cards == "cached":
        for token in tokens.values():
            reply_of(heartbeat(client, token, protocol.Heartbeat(load=a_load())))
    NodeToken.objects.get(pk="gpu-1").revoke("operator")
    assert heartbeat(client, tokens["gpu-1"], protocol.Heartbeat(load=a_load())).status_code == 401
    old = tokens["gpu-2"]
    new = register(client, "gpu-2", gpus=8)
    assert heartbeat(client, old, protocol.Heartbeat(load=a_load())).status_code == 401
    reply_of(heartbeat(client, new, protocol.Heartbeat(load=a_load())))


def test_every_secret_is_compared_in_constant_time(client, tokens, monkeypatch):
    """Both credentials go through hmac.compare_digest, on digests of equal length."""
    calls = []
    real = hmac.compare_digest

    def recording(a, b):
        calls.append((a, b))
        return real(a, b)

    monkeypatch.setattr(hmac, "compare_digest", recording)
    post(client, "/api/v1/register", a_registration(), JOIN_TOKEN + "x")
    assert calls, "the join token was not compared with hmac.compare_digest"
    calls.clear()
    heartbeat(client, "gpu-1." + "A" * 43, protocol.Heartbeat())
    heartbeat(client, tokens["gpu-1"], protocol.Heartbeat())
    assert len(calls) >= 2, "node tokens were not compared with hmac.compare_digest"
    # Digests, not the secrets themselves: equal length whatever was sent.
    assert {len(a) for a, b in calls} == {len(b) for a, b in calls} == {64}


def test_no_secret_is_compared_with_equality_anywhere_in_the_code():
    """A == on a token, secret or digest would leak its prefix through timing."""
    suspicious = ("token", "secret", "digest", "password")
    found = []
    for path in [
        *ROOT.glob("nodes/**/*.py"),
        *ROOT.glob("inventory/**/*.py"),
        *ROOT.glob("livestate/**/*.py"),
        *ROOT.glob("llmgw_site/*.py"),
        *ROOT.glob("lib/*.py"),
    ]:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Compare) and any(isinstance(op, ast.Eq | ast.NotEq) for op in node.ops):
                names = [ast.unparse(part).lower() for part in (node.left, *node.comparators)]
                constants = [isinstance(part, ast.Constant) for part in (node.left, *node.comparators)]
                if any(word in name for name in names for word in suspicious) and not any(constants):
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno}: {ast.unparse(node)}")
    assert found == []


@pytest.fixture
def low_limits(settings):
    settings.LLMGW_REGISTER_PER_MINUTE = 3
    settings.LLMGW_HEARTBEAT_PER_MINUTE = 4
    settings.LLMGW_AUTH_FAILURES_PER_MINUTE = 5
    livestate.reset_client()
    with time_machine.travel(1_800_000_000.0, tick=False):
        yield settings


def test_registration_through_the_view_is_rate_limited_per_address(client, low_limits):
    answers = [post(client, "/api/v1/register", a_registration(f"n-{i}"), JOIN_TOKEN).status_code for i in range(5)]
    assert answers == [200, 200, 200, 429, 429]
    assert Node.objects.count() == 3
    # Another address still gets in.
    response = post_from(client, "10.9.9.9", "/api/v1/register", a_registration("n-9"), JOIN_TOKEN)
    assert response.status_code == 200


def test_heartbeats_through_the_view_are_rate_limited_per_token(client, low_limits):
    token = register(client, "gpu-1")
    answers = [heartbeat(client, token, protocol.Heartbeat(load=a_load())).status_code for _ in range(6)]
    assert answers == [200] * 4 + [429] * 2
    assert protocol.decode(heartbeat(client, token, protocol.Heartbeat()).content, protocol.Rejection).field == "rate"


def test_guessing_node_tokens_gets_the_address_s_wrong_tokens_refused_but_never_a_right_one(client, low_limits):
    token = register(client, "gpu-1")
    for i in range(5):
        assert heartbeat(client, f"gpu-1.guess{i}", protocol.Heartbeat()).status_code == 401
    # Further guesses from that address are refused for the rest of the minute…
    refused = heartbeat(client, "gpu-1.guess5", protocol.Heartbeat())
    assert refused.status_code == 429
    assert protocol.decode(refused.content, protocol.Rejection).field == "authorization"
    # …while the right token from the same address carries on: its agent may share it with the guesser.
    reply_of(heartbeat(client, token, protocol.Heartbeat(load=a_load())))
    # And another address has a budget of its own.
    response = post_from(client, "10.1.1.1", "/api/v1/heartbeat", protocol.Heartbeat(), "gpu-1.guess6")
    assert response.status_code == 401
