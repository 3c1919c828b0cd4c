"""Tokens counted at the gateway equal the engine's own counters, per tenant, model and replica.

A real HAProxy with its Lua usage filter, a real demo engine reporting `usage`, and the sync
taking the totals into the database each pass.
"""

from __future__ import annotations

import json
import shutil
import subprocess

import pytest
from prometheus_client import generate_latest

from agent import enginekinds
from agent.enginekinds.record import StreamUsage
from gateway.models import ApiKey, Tenant, Usage
from gateway.usage import Counted
from inventory.models import Shard
from tests.test_gateway import Engine, Gateway, serve

pytestmark = [pytest.mark.slow, pytest.mark.django_db]


@pytest.fixture
def gateway(tmp_path):
    made = Gateway(tmp_path / "gw")
    yield made
    made.stop()


def key_for(name: str) -> str:
    made = ApiKey(tenant=Tenant.objects.get_or_create(name=name)[0])
    secret = made.issue()
    made.save()
    return secret


def start_engine(gateway, *options):
    replica = serve("gw-1", 0)
    running = Engine(replica.deployment.engine_secret, 0.1, *options)
    Shard.objects.filter(replica=replica).update(port=running.port)
    gateway.sync.run_once()
    running.replica = replica.replica_id
    return running


@pytest.fixture
def engine(gateway, db):
    """A demo engine started by hand: a stream ends with its usage only when the client asks."""
    running = start_engine(gateway)
    yield running
    running.stop()


@pytest.fixture
def engine_as_deployed(gateway, db):
    """A demo engine with the flags its record gives every shard (as an agent starts it)."""
    running = start_engine(gateway, *enginekinds.get("demo").usage_in_streams().flags)
    yield running
    running.stop()


def streamed_usage(answer) -> dict:
    events = [line.removeprefix(b"data: ") for line in answer.iter_lines() if line]
    assert events[-1] == b"[DONE]"
    return json.loads(events[-2])["usage"]


def totals(**where) -> Counted:
    counted = Counted()
    for row in Usage.objects.filter(**where):
        counted.add(Counted(row.requests, row.prompt_tokens, row.completion_tokens))
    return counted


def test_usage_counted_equals_the_engines_for_streams_and_whole_answers(gateway, engine):
    acme, other = key_for("acme"), key_for("other")
    gateway.sync.run_once()
    seen = {"acme": Counted(), "other": Counted()}
    for i in range(1, 13):
        tenant, key = ("acme", acme) if i % 3 else ("other", other)
        prompt = " ".join(["word"] * i)
        body = {"model": "chat", "messages": [{"role": "user", "content": prompt}], "max_tokens": i}
        if i % 2:
            answer = gateway.post("/v1/chat/completions", body, key)
            reported = answer.json()["usage"]
        else:
            body.update(stream=True, stream_options={"include_usage": True})
            reported = streamed_usage(gateway.post("/v1/chat/completions", body, key, stream=True))
        seen[tenant].add(Counted(1, reported["prompt_tokens"], reported["completion_tokens"]))
    gateway.sync.run_once()
    assert totals(tenant="acme") == seen["acme"]
    assert totals(tenant="other") == seen["other"]
    everything = totals()
    assert everything.prompt_tokens == engine.gauge("vllm:prompt_tokens_total")
    assert everything.completion_tokens == engine.tokens_generated()
    assert set(Usage.objects.values_list("model", "replica")) == {("chat", engine.replica)}
    # Taken once: a second pass adds nothing.
    gateway.sync.run_once()
    assert totals() == everything
    # The same counts in the gateway's own series, which promtool finds clean.
    exported = generate_latest(gateway.sync.metrics.registry).decode()
    labels = f'model="chat",replica="{engine.replica}",tenant="acme"'
    assert f"llmgw_gateway_prompt_tokens_total{{{labels}}} {float(seen['acme'].prompt_tokens)}" in exported
    assert f"llmgw_gateway_completion_tokens_total{{{labels}}} {float(seen['acme'].completion_tokens)}" in exported
    promtool = shutil.which("promtool")
    if promtool:
        checked = subprocess.run([promtool, "check", "metrics"], input=exported, capture_output=True, text=True)
        assert checked.returncode == 0 and not checked.stdout.strip(), checked.stdout + checked.stderr


def test_streams_whose_clients_did_not_ask_for_usage_are_counted_from_an_engine_started_as_its_record_says(
    gateway, engine_as_deployed
):
    assert enginekinds.get("demo").usage_in_streams().how == StreamUsage.FLAG
    key = key_for("acme")
    gateway.sync.run_once()
    seen = Counted()
    for i in range(1, 7):
        if i % 2:
            path, body = "/v1/chat/completions", {"messages": [{"role": "user", "content": "w " * i}]}
        else:
            path, body = "/v1/completions", {"prompt": "w " * i}
        body.update(model="chat", max_tokens=i, stream=True)
        if i % 3 == 0:
            body["stream_options"] = {"include_usage": False}  # declined: counted all the same, as vLLM does
        events = [line.removeprefix(b"data: ") for line in gateway.post(path, body, key, stream=True).iter_lines()]
        events = [json.loads(event) for event in events if event and event != b"[DONE]"]
        # What a client that did not ask sees: one more event, with no choices, as OpenAI sends when asked.
        *answer, last = events
        assert last["choices"] == [] and all(event["choices"] and "usage" not in event for event in answer)
        seen.add(Counted(1, last["usage"]["prompt_tokens"], last["usage"]["completion_tokens"]))
    gateway.sync.run_once()
    assert totals() == seen
    assert seen.prompt_tokens == engine_as_deployed.gauge("vllm:prompt_tokens_total") > 0
    assert seen.completion_tokens == engine_as_deployed.tokens_generated() == sum(range(1, 7))


def test_a_stream_whose_client_did_not_ask_is_not_counted_from_an_engine_that_reports_usage_only_when_asked(
    gateway, engine
):
    key = key_for("acme")
    gateway.sync.run_once()
    body = {"model": "chat", "prompt": "a b c", "max_tokens": 4, "stream": True}
    events = [line for line in gateway.post("/v1/completions", body, key, stream=True).iter_lines() if line]
    assert events[-1] == b"data: [DONE]" and not any(b'"usage"' in event for event in events)
    gateway.sync.run_once()
    assert engine.tokens_generated() == 4 and not Usage.objects.exists()


def test_usage_taken_while_the_database_is_down_is_written_on_a_later_pass(gateway, engine):
    key = key_for("acme")
    gateway.sync.run_once()
    assert gateway.post("/v1/completions", {"model": "chat", "prompt": "a b c", "max_tokens": 5}, key).ok
    working = gateway.sync.record_usage

    def database_down(counted):
        raise ConnectionError("database unreachable")

    gateway.sync.record_usage = database_down
    done = gateway.sync.run_once()
    assert any("usage not recorded" in error for error in done.errors)
    assert not Usage.objects.exists()
    gateway.sync.record_usage = working
    gateway.sync.run_once()
    assert totals() == Counted(1, 3, 5)


def test_a_spent_daily_budget_refuses_the_next_request_within_a_pass_until_midnight_utc(gateway, engine):
    key = key_for("acme")
    Tenant.objects.filter(name="acme").update(tokens_per_day=20)
    gateway.sync.run_once()
    body = {"model": "chat", "prompt": "a b c d e", "max_tokens": 10}
    assert gateway.post("/v1/completions", body, key).status_code == 200
    gateway.sync.run_once()
    # 15 of 20 spent: one more passes, and overspends (a request's size is known only once answered).
    assert gateway.post("/v1/completions", body, key).status_code == 200
    gateway.sync.run_once()
    refused = gateway.post("/v1/completions", body, key)
    assert refused.status_code == 429
    assert refused.json()["error"]["message"] == "Token budget spent for tenant acme: tokens per day limit of 20"
    assert refused.json()["error"]["code"] == "rate_limit_exceeded"
    assert 0 < int(refused.headers["Retry-After"]) <= 86_400
    assert engine.tokens_generated() == 20
    # Raised: served again after one pass.
    Tenant.objects.filter(name="acme").update(tokens_per_day=None, tokens_per_minute=1000)
    gateway.sync.run_once()
    assert gateway.post("/v1/completions", body, key).status_code == 200


def test_a_zero_budget_refuses_every_request(gateway, engine):
    key = key_for("acme")
    Tenant.objects.filter(name="acme").update(tokens_per_minute=0)
    gateway.sync.run_once()
    refused = gateway.post("/v1/completions", {"model": "chat", "prompt": "a", "max_tokens": 1}, key)
    assert refused.status_code == 429 and "tokens per minute limit of 0" in refused.json()["error"]["message"]
    assert 0 < int(refused.headers["Retry-After"]) <= 60


def test_a_budget_spent_through_one_gateway_is_refused_by_another(gateway, engine, tmp_path):
    other = Gateway(tmp_path / "gw2")
    try:
        key = key_for("acme")
        Tenant.objects.filter(name="acme").update(tokens_per_day=10)
        gateway.sync.run_once()
        other.sync.run_once()
        body = {"model": "chat", "prompt": "a b c d e", "max_tokens": 10}
        assert gateway.post("/v1/completions", body, key).status_code == 200
        gateway.sync.run_once()  # records the 15 tokens
        other.sync.run_once()  # reads the budget spent
        assert other.post("/v1/completions", body, key).status_code == 429
    finally:
        other.stop()
