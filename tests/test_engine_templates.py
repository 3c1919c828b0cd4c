"""One source of engine command lines: the agent's config shards and the control plane's placed shards agree."""

from __future__ import annotations

import pytest

from agent import config as agent_config
from agent import engine_templates
from agent.engine_templates import Launch
from inventory import desired
from inventory.models import Deployment, Engine, Shard

CONFIG = {"control_plane": "https://cp.example:8000", "join_token": "x", "engines": {}}


def agent_side(engine: str, model: str, port: int, args: list[str]) -> list[str]:
    shard = {"shard": "s", "engine": engine, "model": model, "port": port, "args": args}
    if engine == "command":
        shard = {**shard, "command": args[:1], "args": args[1:]}
    (spec,) = agent_config.shard_specs(agent_config.from_mapping({**CONFIG, "shards": [shard]}))
    return spec.command


def control_plane_side(engine: str, model: str, port: int, args: list[str]) -> list[str]:
    deployment = Deployment(engine=engine, model_source=model, arguments=" ".join(args), gpus_per_shard=0)
    return desired.command(deployment, Shard(port=port, index=0))


@pytest.mark.parametrize("engine", ["vllm", "sglang", "llama.cpp", "command"])
def test_a_config_shard_and_a_placed_shard_start_the_same_command(engine):
    args = ["/opt/engine", "--port", "{port}"] if engine == "command" else ["--ctx-size", "4096"]
    ours = agent_side(engine, "/models/m.gguf", 8200, args)
    assert ours == control_plane_side(engine, "/models/m.gguf", 8200, args)
    if engine != "command":
        # Listening on every address, so that Prometheus and clients on other machines reach it.
        assert ours[ours.index("--host") + 1] == "0.0.0.0" and ours[-2:] == ["--ctx-size", "4096"]


def test_every_model_engine_has_a_template():
    assert set(engine_templates.ENGINES) == set(Engine.values)


def test_sglang_and_llama_cpp_are_asked_for_their_metrics():
    assert "--enable-metrics" in control_plane_side(Engine.SGLANG, "/m", 1, [])
    assert "--metrics" in control_plane_side(Engine.LLAMA_CPP, "/m", 1, [])


def test_llama_cpp_gets_threads_slots_and_gpu_layers():
    argv = engine_templates.command("llama.cpp", Launch("/m/q.gguf", 9000, threads=4, parallel=2, gpus=1))
    assert argv == [
        "llama-server", "--model", "/m/q.gguf", "--host", "0.0.0.0", "--port", "9000", "--metrics",
        "--threads", "4", "--parallel", "2", "--n-gpu-layers", "999",
    ]  # fmt: skip


def test_a_placed_cpu_shard_gets_its_cores_as_threads():
    deployment = Deployment(engine=Engine.LLAMA_CPP, model_source="/m/q.gguf", gpus_per_shard=0, cpu_cores_per_shard=8)
    argv = desired.command(deployment, Shard(port=9000, index=0))
    assert argv[argv.index("--threads") + 1] == "8" and "--n-gpu-layers" not in argv


def test_multi_node_sglang_joins_its_leader():
    argv = engine_templates.command("sglang", Launch("/m", 9000, gpus=8, shards=2, shard_index=1, leader="a:9000"))
    assert argv[argv.index("--tp-size") + 1] == "8"
    assert argv[argv.index("--nnodes") :][:6] == ["--nnodes", "2", "--node-rank", "1", "--dist-init-addr", "a:9000"]


@pytest.mark.parametrize(
    ("version", "head"),
    [
        ("", ["vllm", "serve", "/m"]),
        ("0.11.0", ["vllm", "serve", "/m"]),
        ("0.5.0", ["vllm", "serve", "/m"]),
        ("0.4.3", ["python3", "-m", "vllm.entrypoints.openai.api_server", "--model", "/m"]),
    ],
)
def test_the_version_chooses_the_template(version, head):
    argv = engine_templates.command("vllm", Launch("/m", 9000, gpus=2), version=version)
    assert argv[: len(head)] == head
    assert argv[len(head) :] == ["--host", "0.0.0.0", "--port", "9000", "--tensor-parallel-size", "2"]


def test_an_installed_binary_replaces_the_program():
    argv = engine_templates.command("vllm", Launch("/m"), prefix=["/var/lib/llmgw/engines/vllm/0.11.0/bin/vllm"])
    assert argv[:2] == ["/var/lib/llmgw/engines/vllm/0.11.0/bin/vllm", "serve"]


def test_the_command_engine_fills_in_port_and_model():
    argv = engine_templates.command("command", Launch("/m/x", 7000, extra=("run", "--port={port}", "{model}")))
    assert argv == ["run", "--port=7000", "/m/x"]


@pytest.mark.parametrize(
    ("text", "key"), [("0.10.1rc2", (0, 10, 1)), ("v1.2", (1, 2)), ("0.3.36", (0, 3, 36)), ("dev", ())]
)
def test_version_key(text, key):
    assert engine_templates.version_key(text) == key


def test_the_control_plane_builds_commands_from_the_agents_templates():
    deployment = Deployment(
        engine=Engine.SGLANG, model_source="/m", arguments="--x 1", gpus_per_shard=2, shards_per_replica=2
    )
    shard = Shard(port=9000, index=1)
    launch = engine_templates.Launch(
        model="/m", port=9000, threads=0, gpus=2, shards=2, shard_index=1, leader="a:1", extra=("--x", "1")
    )
    assert desired.command(deployment, shard, "a:1") == engine_templates.command(Engine.SGLANG, launch)
    # The control plane's SGLang shards export metrics, as the agent's own do.
    assert "--enable-metrics" in desired.command(deployment, shard, "a:1")
