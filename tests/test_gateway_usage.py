"""Tokens counted at the gateway equal the engine's own counters, per tenant, model and replica; streams'
times to first token as the client sees them, per model and replica.

A real HAProxy with its Lua usage filter, a real demo engine reporting `usage`, and the sync
taking the totals into the database (and its series) each pass.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import requests
from prometheus_client import generate_latest

from agent import enginekinds
from agent.enginekinds.record import StreamUsage
from devstack.polling import wait_until
from devstack.ports import free_port
from gateway.models import ApiKey, Tenant, Usage
from gateway.usage import Counted
from inventory.models import Shard
from tests.test_gateway import Engine, Gateway, serve

pytestmark = [pytest.mark.slow, pytest.mark.django_db]


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
    promtool_clean(exported)


def promtool_clean(exported: str) -> None:
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
        # What a client that did not ask sees: the running usage the gateway asked for on each event, and
        # one more event with no choices, as OpenAI sends when asked.
        *answer, last = events
        assert last["choices"] == [] and all(event["choices"] for event in answer)
        assert [event["usage"]["completion_tokens"] for event in answer] == list(range(1, i + 1))
        seen.add(Counted(1, last["usage"]["prompt_tokens"], last["usage"]["completion_tokens"]))
    gateway.sync.run_once()
    assert totals() == seen
    assert seen.prompt_tokens == engine_as_deployed.gauge("vllm:prompt_tokens_total") > 0
    assert seen.completion_tokens == engine_as_deployed.tokens_generated() == sum(range(1, 7))


def test_a_stream_whose_client_did_not_ask_is_counted_from_an_engine_that_reports_usage_only_when_asked(
    gateway, engine
):
    """The pinned vLLM 0.11.0's and SGLang 0.5.3's case (no flag forces it): the relay asks for the client."""
    key = key_for("acme")
    gateway.sync.run_once()
    # The client's own object, as a client may send it: spaced, a member the relay also names, a newline after.
    body = b'{"model": "chat", "prompt": "a b c", "max_tokens": 4, "stream": true,\n "stream_options": {}}\n'
    answer = gateway.post("/v1/completions", body, key, stream=True)
    events = [line.removeprefix(b"data: ") for line in answer.iter_lines() if line]
    assert events[-1] == b"[DONE]"
    # The client's members reached the engine (its prompt and max_tokens), the relay's too (a running usage).
    running = [json.loads(event)["usage"]["completion_tokens"] for event in events[:-2]]
    assert running == [1, 2, 3, 4] and json.loads(events[-2])["choices"] == []
    gateway.sync.run_once()
    assert totals() == Counted(1, 3, 4)
    assert engine.gauge("vllm:prompt_tokens_total") == 3 and engine.tokens_generated() == 4


def test_a_running_usage_on_every_event_is_counted_once_as_the_engine_counts_it(gateway, engine):
    """vLLM's continuous usage stats: each event's usage counts the stream so far; counted at the last."""
    key = key_for("acme")
    gateway.sync.run_once()
    seen = Counted()
    for i in range(1, 6):
        path, body = ("/v1/chat/completions", {"messages": [{"role": "user", "content": "w " * i}]})
        if i % 2:
            path, body = "/v1/completions", {"prompt": "w " * i}
        options = {"include_usage": True, "continuous_usage_stats": True}
        body.update(model="chat", max_tokens=2 * i, stream=True, stream_options=options)
        answer = gateway.post(path, body, key, stream=True)
        assert answer.status_code == 200, answer.text
        events = [line.removeprefix(b"data: ") for line in answer.iter_lines() if line]
        assert events[-1] == b"[DONE]"
        running = [json.loads(event)["usage"]["completion_tokens"] for event in events[:-2]]
        assert running == list(range(1, 2 * i + 1))  # a running usage on each of the answer's events
        last = json.loads(events[-2])["usage"]
        seen.add(Counted(1, last["prompt_tokens"], last["completion_tokens"]))
    gateway.sync.run_once()
    assert totals() == seen
    assert seen.prompt_tokens == engine.gauge("vllm:prompt_tokens_total") > 0
    assert seen.completion_tokens == engine.tokens_generated() == sum(range(2, 11, 2))


def test_a_stream_of_more_pieces_than_the_relay_keeps_is_counted_once_as_the_engine_counts_it(gateway, engine):
    """The relay keeps a stream's pieces and reads them 64 at a time (deploy/gateway_usage.lua, KEEP): 150
    events with a running usage are read twice on the way and once at the end, and counted once."""
    key = key_for("acme")
    gateway.sync.run_once()
    options = {"include_usage": True, "continuous_usage_stats": True}
    body = {"model": "chat", "prompt": "a b c", "max_tokens": 150, "stream": True, "stream_options": options}
    last = streamed_usage(gateway.post("/v1/completions", body, key, stream=True))
    assert last["completion_tokens"] == 150
    gateway.sync.run_once()
    assert totals(tenant="acme", replica=engine.replica) == Counted(1, last["prompt_tokens"], 150)
    assert engine.tokens_generated() == 150


@pytest.fixture
def slow_engine(gateway, db):
    """A demo engine that takes 50 ms a token: a stream lasts long enough to be left mid-way."""
    running = start_engine(gateway, "--ms-between-tokens", "50")
    yield running
    running.stop()


def test_a_client_gone_mid_stream_keeps_the_tokens_its_running_usage_counted(gateway, slow_engine):
    key = key_for("acme")
    gateway.sync.run_once()
    options = {"include_usage": True, "continuous_usage_stats": True}
    body = {"model": "chat", "prompt": "a b c", "max_tokens": 200, "stream": True, "stream_options": options}
    answer = gateway.post("/v1/completions", body, key, stream=True)
    received = 0
    for line in answer.iter_lines():
        if line.startswith(b"data: {"):
            received = json.loads(line.removeprefix(b"data: "))["usage"]["completion_tokens"]
            if received == 5:
                break
    answer.close()  # gone, 195 tokens short of the end
    wait_until(lambda: slow_engine.gauge("vllm:num_requests_running") == 0, 10, "the engine to drop the stream")
    gateway.sync.run_once()
    counted = totals()
    assert counted.requests == 1 and counted.prompt_tokens == 3 == slow_engine.gauge("vllm:prompt_tokens_total")
    # At least what the client read; at most what the engine made before it saw the stream gone (the
    # token whose write failed, and those HAProxy got as it closed).
    assert received <= counted.completion_tokens <= slow_engine.tokens_generated() < 200


def test_a_client_gone_mid_stream_that_did_not_ask_for_usage_is_counted_up_to_where_it_left(gateway, slow_engine):
    key = key_for("acme")
    gateway.sync.run_once()
    body = {"model": "chat", "messages": [{"role": "user", "content": "a b c"}], "max_tokens": 200, "stream": True}
    answer = gateway.post("/v1/chat/completions", body, key, stream=True)
    received = 0
    for line in answer.iter_lines():
        if line.startswith(b"data: {") and json.loads(line.removeprefix(b"data: "))["choices"]:
            received += 1
            if received == 5:
                break
    answer.close()  # gone, 195 tokens short of the end, having asked for no usage
    wait_until(lambda: slow_engine.gauge("vllm:num_requests_running") == 0, 10, "the engine to drop the stream")
    gateway.sync.run_once()
    counted = totals()
    prompt = slow_engine.gauge("vllm:prompt_tokens_total")
    assert counted.requests == 1 and counted.prompt_tokens == prompt > 0
    assert received <= counted.completion_tokens <= slow_engine.tokens_generated() < 200


def ttft_samples(exported: str, replica: str) -> dict[str, float]:
    """The gateway's time-to-first-token series for `chat` on `replica`: bucket bounds, count and sum."""
    name = "llmgw_gateway_time_to_first_token_seconds"
    samples = {}
    for line in exported.splitlines():
        if line.startswith(name) and f'replica="{replica}"' in line and 'served_model="chat"' in line:
            series, value = line.rsplit(" ", 1)
            if "_bucket" in series:
                samples[series.split('le="')[1].split('"')[0]] = float(value)
            else:
                samples[series.split("{")[0].removeprefix(name + "_")] = float(value)
    return samples


def test_a_streams_time_to_first_token_lands_in_its_bucket_and_whole_answers_are_not_timed(gateway, db):
    replica = serve("gw-1", 0)
    # The engine waits 300 ms (wall clock) before each request's first token.
    slow = Engine(replica.deployment.engine_secret, 0.1, "--ms-to-first-token", "300")
    try:
        Shard.objects.filter(replica=replica).update(port=slow.port)
        key = key_for("acme")
        gateway.sync.run_once()
        client = requests.Session()  # one kept-alive connection
        body = {"model": "chat", "prompt": "a b", "max_tokens": 3, "stream": True}
        headers = {"Authorization": f"Bearer {key}"}
        for i in range(3):
            if i == 2:
                # Idle on the kept-alive connection: the next request's time starts when it is sent, not before.
                time.sleep(1.2)
            answer = client.post(gateway.url("/v1/completions"), json=body, headers=headers, timeout=10)
            assert answer.status_code == 200 and answer.text.endswith("data: [DONE]\n\n")
        engine_sum = slow.gauge("vllm:time_to_first_token_seconds_sum")
        whole = client.post(gateway.url("/v1/completions"), json={**body, "stream": False}, headers=headers)
        assert whole.status_code == 200
        gateway.sync.run_once()
        exported = generate_latest(gateway.sync.metrics.registry).decode()
        seen = ttft_samples(exported, replica.replica_id)
        # Three streams, none faster than the engine's 300 ms, none counting the idle 1.2 s before it.
        assert seen["count"] == 3
        assert seen["0.25"] == 0
        assert seen["1.0"] == 3 and seen["+Inf"] == 3
        # The gateway's time holds the engine's own, from its arrival to its first write, for the same streams.
        assert slow.gauge("vllm:time_to_first_token_seconds_count") == 4
        assert 0.9 <= seen["sum"] < 3.0
        assert seen["sum"] >= engine_sum - 0.001
        promtool_clean(exported)
        # Taken once: the next pass adds nothing.
        gateway.sync.run_once()
        assert ttft_samples(generate_latest(gateway.sync.metrics.registry).decode(), replica.replica_id) == seen
    finally:
        slow.stop()


class CutUsage(BaseHTTPRequestHandler):
    """An engine whose stream carries `"usage": null` in every event, and its real usage cut in three pieces,
    each sent apart from the next (HAProxy forwards each as it comes: the filter sees three); its whole
    answers come in two pieces, the usage in the second."""

    protocol_version = "HTTP/1.1"
    PIECES: tuple[bytes, ...] = (
        b'data: {"choices":[{"text":"a"}],"usage":null}\n\ndata: {"choices":[],"us',
        b'age": {"prompt_tokens": 7, "compl',
        b'etion_tokens": 9, "total_tokens": 16}}\n\ndata: [DONE]\n\n',
    )
    WHOLE = (b'{"choices":[{"text":"a"}],', b'"usage":{"prompt_tokens":7,"completion_tokens":9,"total_tokens":16}}')

    def do_POST(self) -> None:
        stream = b'"stream": true' in self.rfile.read(int(self.headers["Content-Length"]))
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream" if stream else "application/json")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        for piece in self.PIECES if stream else self.WHOLE:
            self.wfile.write(f"{len(piece):x}\r\n".encode() + piece + b"\r\n")
            self.wfile.flush()
            time.sleep(0.1)
        self.wfile.write(b"0\r\n\r\n")

    def log_message(self, format, *args) -> None:
        pass


class CutTimings(CutUsage):
    """llama-server's chat stream, unasked: no usage, and its last event's timings cut in three pieces, the
    key itself between the first two; the whole answer has usage, and timings after it (not added)."""

    PIECES = (
        b'data: {"choices":[{"delta":{"content":"a"}}]}\n\ndata: {"choices":[],"timing',
        b's": {"cache_n": 3, "prompt_n": 4, "prompt_ms": 1.5, "predi',
        b'cted_n": 9, "predicted_ms": 20.1}}\n\ndata: [DONE]\n\n',
    )
    WHOLE = (
        b'{"choices":[{"text":"a"}],',
        b'"usage":{"prompt_tokens":7,"completion_tokens":9},"timings":{"cache_n":3,"prompt_n":4,"predicted_n":9}}',
    )


class CutRunningUsage(CutUsage):
    """vLLM's continuous usage stats: a running usage on every event, counted as the stream goes. One is cut
    in three, two share a piece, an answer's text says `data: [DONE]` (not the end: more usage follows),
    and the real [DONE] comes cut from its newline."""

    PIECES = (
        b'data: {"choices":[{"text":"a"}],"usage":{"prompt_tokens":7,"completion_tokens":1}}\n\n',
        b'data: {"choices":[{"text":"data: [DONE]"}],"usage":{"prompt_tokens":7,"completion_tokens":2}}\n\n'
        b'data: {"choices":[{"text":"b"}],"usage":{"prompt_tokens":7,"compl',
        b'etion_tokens":3}}\n\ndata: {"choices":[{"text":"c"}],"us',
        b'age":{"prompt_tokens":7,"completion_tokens":8}}\n\n',
        b'data: {"choices":[],"usage":{"prompt_tokens":7,"completion_tokens":9}}\n\ndata: [DONE]',
        b"\n\n",
    )


class LastUsageWithoutCounts(CutUsage):
    """A usage with its counts, then, in the same piece, one without them (an empty object): the counts are
    those of the last usage that has them (only the last whole one is read first)."""

    PIECES = (
        b'data: {"choices":[{"text":"a"}],"usage":{"prompt_tokens":7,"completion_tokens":9}}\n\n'
        b'data: {"choices":[],"usage":{}}\n\n',
        b"data: [DONE]\n\n",
    )


@pytest.mark.parametrize(
    "engine_answer",
    [CutUsage, CutTimings, CutRunningUsage, LastUsageWithoutCounts],
    ids=["usage", "timings", "running-usage", "last-without-counts"],
)
def test_a_usage_cut_between_pieces_of_an_answer_is_counted_once_whole(gateway, db, engine_answer):
    replica = serve("gw-1", 0)
    server = ThreadingHTTPServer(("127.0.0.1", free_port()), engine_answer)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        Shard.objects.filter(replica=replica).update(port=server.server_address[1])
        key = key_for("acme")
        gateway.sync.run_once()
        for _ in range(2):
            answer = gateway.post("/v1/completions", {"model": "chat", "prompt": "x", "stream": True}, key)
            assert answer.status_code == 200 and answer.text.endswith("data: [DONE]\n\n")
        whole = gateway.post("/v1/completions", {"model": "chat", "prompt": "x"}, key)
        assert whole.json()["usage"]["completion_tokens"] == 9
        gateway.sync.run_once()
        assert totals(tenant="acme") == Counted(3, 21, 27)
    finally:
        server.shutdown()
        server.server_close()


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
