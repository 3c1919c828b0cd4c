"""A factual question through the gateway with a tenant's key, answered by a real engine running a real model,
and its tokens counted as the engine counts them.

llama-server (the agent's install, from the shared cache) serves SmolLM2-135M-Instruct with its
deployment's secret set as the agent sets it (LLMGW_ENGINE_API_KEY, which the engine record's
`environment()` hands to llama-server as LLAMA_API_KEY); a gateway (HAProxy on deploy/gateway.cfg,
programmed by the sync from the database) routes the served model `smollm2` to it. The fixtures
are tests/test_engine_llama_cpp.py's: warm, the engine and the model come from ~/.cache/llmgw.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import urllib.request

import pytest
import requests

from agent import enginekinds
from agent.enginekinds import Launch
from agent.enginekinds.record import API_KEY_ENV, StreamUsage
from devstack.polling import wait_until
from devstack.ports import free_port
from gateway.models import ApiKey, Tenant, Usage
from inventory.models import Deployment, Engine, Shard
from tests.test_engine_llama_cpp import DEMO_ARGUMENTS, VERSION, healthy, llama_server, model  # noqa: F401
from tests.test_gateway import Gateway, serve

pytestmark = pytest.mark.slow

QUESTION = {
    "model": "smollm2",
    "messages": [{"role": "user", "content": "What is the capital of France?"}],
    "max_tokens": 32,
    "temperature": 0,
}


def start_engine(bin_dir, model_path, secret: str) -> tuple[subprocess.Popen, int]:
    """llama-server as the agent's runner starts it: the record's command line and environment."""
    port = free_port()
    launch = Launch(
        str(model_path), port, host="127.0.0.1", threads=2, parallel=1, served_name="smollm2", extra=DEMO_ARGUMENTS
    )
    command = enginekinds.command_line("llama.cpp", launch, VERSION, prefix=[str(bin_dir / "llama-server")])
    env = enginekinds.get("llama.cpp").environment({**os.environ, API_KEY_ENV: secret})
    assert env["LLAMA_API_KEY"] == secret
    process = subprocess.Popen(
        command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
    )
    return process, port


def stop_engine(process: subprocess.Popen) -> None:
    # Its group, the server's threads with it; already gone if it crashed, which the test reports.
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGKILL)
    process.wait()


def engine_requests(port: int, secret: str) -> float:
    """Prompt tokens the engine has read: unchanged when no request reached it (its /metrics takes the secret)."""
    request = urllib.request.Request(f"http://127.0.0.1:{port}/metrics", headers={"Authorization": f"Bearer {secret}"})
    with urllib.request.urlopen(request, timeout=10) as response:
        text = response.read().decode()
    return sum(
        float(line.rpartition(" ")[2]) for line in text.splitlines() if line.startswith("llamacpp:prompt_tokens_total")
    )


def engine_tokens(port: int, secret: str) -> tuple[float, float]:
    """What the engine has counted: prompt tokens (read and taken from its cache) and tokens predicted."""
    request = urllib.request.Request(f"http://127.0.0.1:{port}/metrics", headers={"Authorization": f"Bearer {secret}"})
    with urllib.request.urlopen(request, timeout=10) as response:
        values = dict(line.rsplit(" ", 1) for line in response.read().decode().splitlines() if line[:1] != "#")
    prompt = float(values["llamacpp:prompt_tokens_total"]) + float(values["llamacpp:prompt_tokens_cached_total"])
    return prompt, float(values["llamacpp:tokens_predicted_total"])


def ask(
    gateway: Gateway, body: dict, key: str | None, stream: bool = False, path: str = "/v1/chat/completions"
) -> requests.Response:
    # Generation on two shared cores: longer than the other gateway tests' 10 s.
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    return requests.post(gateway.url(path), json=body, headers=headers, stream=stream, timeout=300)


@pytest.mark.django_db
def test_the_capital_of_france_through_the_gateway_with_a_key(llama_server, model, tmp_path):  # noqa: F811
    replica = serve("cpu-node", 0, served="smollm2")
    secret = replica.deployment.engine_secret
    tenant_key = ApiKey(tenant=Tenant.objects.create(name="acme"))
    key = tenant_key.issue()
    tenant_key.save()
    process, port = start_engine(llama_server, model, secret)
    gateway = Gateway(tmp_path / "gw")
    try:
        wait_until(lambda: process.poll() is not None or healthy(port), 300, "the model to load")
        assert process.poll() is None, "llama-server exited"
        # The engine refuses anyone without its deployment's secret: only the gateway reaches it.
        direct = requests.post(f"http://127.0.0.1:{port}/v1/chat/completions", json=QUESTION, timeout=10)
        assert direct.status_code == 401
        Shard.objects.filter(replica=replica).update(port=port)
        gateway.program()

        answer = ask(gateway, QUESTION, key)
        assert answer.status_code == 200, answer.text
        (choice,) = answer.json()["choices"]
        assert "Paris" in choice["message"]["content"], answer.json()
        # Named as the client called it, never by the path its weights were loaded from.
        assert answer.json()["model"] == "smollm2"
        read = engine_requests(port, secret)

        refused = ask(gateway, QUESTION, None)
        assert refused.status_code == 401 and refused.json()["error"]["code"] == "invalid_api_key"
        assert engine_requests(port, secret) == read

        streamed = ask(gateway, {**QUESTION, "stream": True}, key, stream=True)
        assert streamed.status_code == 200 and streamed.headers["Content-Type"].startswith("text/event-stream")
        events = [line.removeprefix(b"data: ") for line in streamed.iter_lines() if line]
        assert events[-1] == b"[DONE]"
        words = "".join(
            (chunk["choices"][0]["delta"].get("content") or "")
            for chunk in map(json.loads, events[:-1])
            if chunk["choices"]
        )
        assert "Paris" in words, words
        assert {chunk["model"] for chunk in map(json.loads, events[:-1])} == {"smollm2"}
    finally:
        gateway.stop()
        stop_engine(process)


def stream_events(answer: requests.Response) -> list[dict]:
    assert answer.status_code == 200, answer.text
    events = [line.removeprefix(b"data: ") for line in answer.iter_lines() if line]
    assert events[-1] == b"[DONE]"
    return [json.loads(event) for event in events[:-1]]


@pytest.mark.django_db
def test_streams_are_counted_as_the_engine_counts_them_where_it_reports_usage(llama_server, model, tmp_path):  # noqa: F811
    """llama-server's record says TIMINGS: its chat streams report usage only when asked, but every stream
    ends with its timings, from which the gateway counts it; its /v1/completions streams end with usage."""
    assert enginekinds.get("llama.cpp").usage_in_streams(VERSION).how == StreamUsage.TIMINGS
    replica = serve("cpu-node", 0, served="smollm2")
    # A llama.cpp deployment: what the relay asks of its streams is its record's (running timings).
    Deployment.objects.filter(pk=replica.deployment_id).update(engine=Engine.LLAMA_CPP)
    secret = replica.deployment.engine_secret
    tenant_key = ApiKey(tenant=Tenant.objects.create(name="acme"))
    key = tenant_key.issue()
    tenant_key.save()
    process, port = start_engine(llama_server, model, secret)
    gateway = Gateway(tmp_path / "gw")
    try:
        wait_until(lambda: process.poll() is not None or healthy(port), 300, "the model to load")
        assert process.poll() is None, "llama-server exited"
        Shard.objects.filter(replica=replica).update(port=port)
        gateway.program()
        chat = {**QUESTION, "max_tokens": 8, "stream": True}

        # A chat stream whose client did not ask: running timings on every event (the relay asked for them),
        # counted once for all of them, equal to what the engine counted for it. Its counters move when its
        # slot is released, just after the last event.
        before = engine_tokens(port, secret)
        events = stream_events(ask(gateway, chat, key, stream=True))
        assert sum("timings" in event for event in events) > 2

        def moved() -> bool:
            return all(now > then for now, then in zip(engine_tokens(port, secret), before, strict=True))

        wait_until(moved, 10, "the engine to count the stream")
        gateway.sync.run_once()
        (row,) = Usage.objects.all()
        counted = (row.prompt_tokens, row.completion_tokens)
        assert row.requests == 1 and counted[1] > 0
        assert engine_tokens(port, secret) == (before[0] + counted[0], before[1] + counted[1])
        Usage.objects.all().delete()

        # A completions stream whose client did not ask, and a chat stream whose client did: counted once
        # each (from usage, the asked stream's timings beside it not added), equal to the engine's counts.
        before = engine_tokens(port, secret)
        completion = {"model": "smollm2", "prompt": "The capital of France is", "max_tokens": 8, "stream": True}
        reported = [stream_events(ask(gateway, completion, key, stream=True, path="/v1/completions"))[-1]["usage"]]
        asked = stream_events(ask(gateway, {**chat, "stream_options": {"include_usage": True}}, key, stream=True))
        assert asked[-1]["choices"] == []
        reported.append(asked[-1]["usage"])
        gateway.sync.run_once()
        rows = list(Usage.objects.all())
        counted = (sum(row.prompt_tokens for row in rows), sum(row.completion_tokens for row in rows))
        assert sum(row.requests for row in rows) == 2
        assert counted == (sum(u["prompt_tokens"] for u in reported), sum(u["completion_tokens"] for u in reported))
        engine = (before[0] + counted[0], before[1] + counted[1])
        wait_until(lambda: engine_tokens(port, secret) == engine, 10, f"the engine's counters at {engine}")
        Usage.objects.all().delete()

        # A chat stream whose client leaves after 3 events of a 200-token answer, having asked for nothing:
        # counted as far as the relay's running timings got, its prompt as the engine counted it.
        before = engine_tokens(port, secret)
        story = [{"role": "user", "content": "Write a long story about a dragon who learns to read."}]
        answer = ask(gateway, {**chat, "messages": story, "max_tokens": 200}, key, stream=True)
        received = 0
        for line in answer.iter_lines():
            if line.startswith(b"data: {"):
                received += 1
                if received == 3:
                    break
        answer.close()
        wait_until(moved, 30, "the engine to count the stream it lost")
        gateway.sync.run_once()
        (row,) = Usage.objects.all()
        engine_moved = [now - then for now, then in zip(engine_tokens(port, secret), before, strict=True)]
        assert row.requests == 1 and row.prompt_tokens == engine_moved[0]
        assert received - 1 <= row.completion_tokens <= engine_moved[1] < 200
    finally:
        gateway.stop()
        stop_engine(process)
