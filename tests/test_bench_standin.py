"""The stand-in engine under bench.routing and bench.gateway, the real gateway bench.gateway runs, their quick runs
(and bench.fairness's)."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bench.standin import client
from bench.standin.engine import Pace, Replica, serve
from bench.standin.fleet import Fleet
from bench.standin.real_gateway import RealGateway, desired

ROOT = Path(__file__).resolve().parent.parent
INSTANT = Pace(slots=4, decode_tps=0, prefill_tps=0)
QUESTION = [{"role": "user", "content": "Name three colours."}]


async def engine(pace: Pace, api_key: str | None = None) -> tuple[int, Replica, asyncio.Server]:
    replica = Replica("standin", pace, api_key)
    (server,) = await serve([("127.0.0.1", 0, replica)])
    return server.sockets[0].getsockname()[1], replica, server


def chat(max_tokens: int, stream: bool, key: str | None = None, messages: list | None = None) -> bytes:
    body = client.chat_body("standin", messages or QUESTION, max_tokens, stream)
    return client.request_bytes("/v1/chat/completions", body, key)


async def raw(port: int, request: bytes) -> tuple[int, bytes]:
    """Status and body of one request on its own connection, the body de-chunked."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(request)
    head = await reader.readuntil(b"\r\n\r\n")
    body = b""
    if b"chunked" in head.lower():
        while size := int((await reader.readuntil(b"\r\n")).strip(), 16):
            body += (await reader.readexactly(size + 2))[:-2]
    else:
        length = int(next(ln for ln in head.split(b"\r\n") if ln.lower().startswith(b"content-length")).split(b":")[1])
        body = await reader.readexactly(length)
    writer.close()
    return int(head.split(b" ")[1]), body


def events(body: bytes) -> list[str]:
    return [line[len("data: ") :] for line in body.decode().split("\n\n") if line.startswith("data: ")]


def test_a_chat_completion_answers_whole_with_usage():
    async def go():
        port, _, server = await engine(INSTANT)
        status, body = await raw(port, chat(5, stream=False))
        server.close()
        return status, json.loads(body)

    status, answer = asyncio.run(go())
    assert status == 200
    assert answer["object"] == "chat.completion"
    assert len(answer["choices"][0]["message"]["content"].split()) == 5
    assert answer["usage"]["prompt_tokens"] == 3
    assert answer["usage"]["completion_tokens"] == 5


def test_a_streamed_chat_completion_sends_each_token_then_usage_then_done():
    async def go():
        port, _, server = await engine(Pace(slots=1, decode_tps=500, prefill_tps=0))
        status, body = await raw(port, chat(4, stream=True))
        server.close()
        return status, events(body)

    status, found = asyncio.run(go())
    assert status == 200
    assert found[-1] == "[DONE]"
    chunks = [json.loads(event) for event in found[:-1]]
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    assert "".join(c["choices"][0]["delta"].get("content", "") for c in chunks).split() == [
        "the",
        "sea",
        "is",
        "blue",
    ]
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"
    # Usage once, at the end: the stream did not ask for a running one.
    assert ["usage" in c for c in chunks] == [False] * 4 + [True]
    assert chunks[-1]["usage"]["completion_tokens"] == 4


def test_a_stream_that_asks_for_vllms_running_usage_gets_one_on_every_event():
    async def go():
        port, _, server = await engine(Pace(slots=1, decode_tps=500, prefill_tps=0))
        asked = {**json.loads(chat(3, stream=True).partition(b"\r\n\r\n")[2])}
        asked["stream_options"] = {"include_usage": True, "continuous_usage_stats": True}
        running = await raw(port, client.request_bytes("/v1/chat/completions", json.dumps(asked).encode()))
        asked["stream_options"] = "yes"
        refused = await raw(port, client.request_bytes("/v1/chat/completions", json.dumps(asked).encode()))
        server.close()
        return running, refused

    (status, body), refused = asyncio.run(go())
    assert status == 200
    chunks = [json.loads(event) for event in events(body)[:-1]]
    # Each token's event counts the tokens so far; the last, the whole answer, as vLLM's do.
    assert [c["usage"]["completion_tokens"] for c in chunks] == [1, 2, 3, 3]
    assert {c["usage"]["prompt_tokens"] for c in chunks} == {3}
    assert refused[0] == 400 and json.loads(refused[1])["error"]["param"] == "stream_options"


def test_a_plain_completion_streams_too():
    async def go():
        port, _, server = await engine(INSTANT)
        body = json.dumps({"model": "standin", "prompt": "Once upon", "max_tokens": 2, "stream": True}).encode()
        status, answer = await raw(port, client.request_bytes("/v1/completions", body))
        server.close()
        return status, events(answer)

    status, found = asyncio.run(go())
    assert status == 200
    assert found[-1] == "[DONE]"
    assert json.loads(found[0])["object"] == "text_completion"


def test_with_one_slot_the_second_request_waits_for_the_first_to_finish():
    async def go():
        port, replica, server = await engine(Pace(slots=1, decode_tps=100, prefill_tps=0))
        first = asyncio.create_task(client.send(client.Pool(port), chat(5, stream=True)))
        while replica.processing == 0:
            await asyncio.sleep(0.001)
        second = asyncio.create_task(client.send(client.Pool(port), chat(5, stream=True)))
        while replica.deferred == 0 and not second.done():
            await asyncio.sleep(0.001)
        deferred_seen = replica.deferred
        metrics = (await client.get(port, "/metrics")).decode()
        a, b = await first, await second
        server.close()
        return a, b, deferred_seen, metrics

    a, b, deferred_seen, metrics = asyncio.run(go())
    assert a.ok and b.ok
    assert deferred_seen == 1
    assert "llamacpp:requests_deferred 1" in metrics
    assert "llamacpp:requests_processing 1" in metrics
    assert b.first >= a.done


def test_a_prompt_seen_before_is_answered_from_the_prefix_cache():
    long_prompt = [{"role": "system", "content": " ".join(f"w{i}" for i in range(100))}]

    async def go():
        port, _, server = await engine(Pace(slots=1, decode_tps=0, prefill_tps=0))
        pool = client.Pool(port)
        first = await client.send(pool, chat(1, stream=True, messages=long_prompt))
        again = await client.send(pool, chat(1, stream=True, messages=long_prompt))
        server.close()
        return first, again

    first, again = asyncio.run(go())
    assert first.cached_tokens == 0
    # Whole 16-token blocks are cached: 96 of the 100.
    assert again.cached_tokens == 96


def test_given_a_key_the_engine_answers_only_requests_bearing_it():
    async def go():
        port, _, server = await engine(INSTANT, api_key="s3cret")
        without = await raw(port, chat(1, stream=False))
        wrong = await raw(port, chat(1, stream=False, key="nope"))
        right = await raw(port, chat(1, stream=False, key="s3cret"))
        health = await client.get(port, "/health")
        server.close()
        return without, wrong, right, health

    without, wrong, right, health = asyncio.run(go())
    assert without[0] == wrong[0] == 401
    assert json.loads(without[1])["error"]["type"] == "authentication_error"
    assert right[0] == 200
    assert json.loads(health) == {"status": "ok"}


def test_a_bad_body_is_a_400_naming_the_field():
    async def go():
        port, _, server = await engine(INSTANT)
        not_json = await raw(port, client.request_bytes("/v1/chat/completions", b"{nope"))
        body = json.dumps({"messages": QUESTION, "max_tokens": "many"}).encode()
        bad_tokens = await raw(port, client.request_bytes("/v1/chat/completions", body))
        server.close()
        return not_json, bad_tokens

    not_json, bad_tokens = asyncio.run(go())
    assert not_json[0] == 400 and json.loads(not_json[1])["error"]["param"] == "body"
    assert bad_tokens[0] == 400 and json.loads(bad_tokens[1])["error"]["param"] == "max_tokens"


def test_a_client_gone_from_the_queue_leaves_it_at_once():
    async def go():
        port, replica, server = await engine(Pace(slots=1, decode_tps=2, prefill_tps=0))
        holder = await asyncio.open_connection("127.0.0.1", port)
        holder[1].write(chat(1000, stream=True))
        await holder[0].readuntil(b"data: ")
        _, waiter = await asyncio.open_connection("127.0.0.1", port)
        waiter.write(chat(5, stream=True))
        deadline = time.monotonic() + 5
        while replica.deferred == 0 and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        queued = replica.deferred
        waiter.close()
        while replica.deferred and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        left, still_running = replica.deferred, replica.processing
        holder[1].close()
        server.close()
        return queued, left, still_running

    queued, left, still_running = asyncio.run(go())
    assert queued == 1
    # Gone from the queue while the first request still holds the only slot, not when it is done.
    assert left == 0
    assert still_running == 1


@pytest.mark.slow
def test_the_benchmarked_gateway_is_programmed_by_the_sync_checks_keys_and_adds_the_engine_secret():
    async def ask(port: int) -> dict:
        other_model = client.chat_body("other", QUESTION, 1, False)
        return {
            "good": await raw(port, chat(2, stream=True, key="good-key")),
            "no key": await raw(port, chat(1, stream=False)),
            "bad key": await raw(port, chat(1, stream=False, key="bad-key")),
            "unknown model": await raw(port, client.request_bytes("/v1/chat/completions", other_model, "good-key")),
        }

    with Fleet([1.0], INSTANT, api_key="replica-secret") as fleet:
        wanted = desired({"standin": fleet.servers()}, "replica-secret", {"tenant": "good-key"})
        with RealGateway(wanted) as proxy:
            # Added by the sync over the Runtime API, as production's servers are.
            assert set(proxy.runtime.servers()["m_standin"]) == {"standin-r0"}
            answers = asyncio.run(ask(proxy.port))
    assert answers["good"][0] == 200 and events(answers["good"][1])[-1] == "[DONE]"
    assert answers["no key"][0] == answers["bad key"][0] == 401
    assert json.loads(answers["bad key"][1])["error"]["code"] == "invalid_api_key"
    assert answers["unknown model"][0] == 404
    assert json.loads(answers["unknown model"][1])["error"]["param"] == "model"


@pytest.mark.slow
@pytest.mark.parametrize("module", ["bench.routing", "bench.gateway", "bench.fairness"])
def test_the_benchmark_runs_to_the_end_in_its_quick_mode(module):
    done = subprocess.run(
        [sys.executable, "-m", module, "--quick"], cwd=ROOT, capture_output=True, text=True, timeout=180
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "| --- |" in done.stdout
    assert "errors" in done.stdout


def test_the_fixed_engine_answers_what_clients_parse_and_wrk_counts_it_through_the_gateway(tmp_path):
    """bench.gateway's engine for wrk: a chat completion, its SSE stream and that stream paced, each parsed
    as an OpenAI client would; through the real gateway wrk counts every request and no error."""
    from bench.standin import wrk
    from bench.standin.proxy import Server as StandinServer

    with wrk.FixedEngine("fixed", pace_ms=25) as fixed:
        answers = {}
        for kind, stream in (("json", False), ("sse", True), ("paced", True)):
            body = wrk.chat_body("fixed", stream).encode()
            started = time.monotonic()
            status, answers[kind] = asyncio.run(
                raw(fixed.ports[kind], client.request_bytes("/v1/chat/completions", body, "k"))
            )
            took = time.monotonic() - started
            assert status == 200
        assert json.loads(answers["json"])["choices"][0]["message"]["content"] == "The capital of France is Paris."
        for kind in ("sse", "paced"):
            events = [e.removeprefix(b"data: ") for e in answers[kind].split(b"\n\n") if e]
            assert events[-1] == b"[DONE]"
            chunks = [json.loads(e) for e in events[:-1]]
            text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"])
            assert text == "The capital of France is Paris." and chunks[-1]["usage"]["completion_tokens"] == 7
        assert took >= 0.05, "the paced stream sleeps twice, 25 ms each"

        servers = {"fixed": [StandinServer("r1", fixed.ports["json"])]}
        with RealGateway(desired(servers, "engine-secret", {"t": "tenant-key"})) as gateway:
            lua = wrk.script(tmp_path, "good", wrk.chat_body("fixed", False), "tenant-key")
            good = wrk.run(gateway.port, lua, 4, 1)
            assert good["requests"] > 10 and good["errors"] == 0 and 0 < good["p50"] <= good["p99"]
            # A wrong key is answered 401 by the gateway, and wrk counts each as an error.
            bad = wrk.run(gateway.port, wrk.script(tmp_path, "bad", wrk.chat_body("fixed", False), "nope"), 1, 1)
            assert bad["requests"] > 0 and bad["errors"] == bad["requests"]
