"""Command templates: how each engine is started for a shard of the config.

A template takes the engine's command prefix (from the config's `engines`, else the
usual binary) and the shard, and returns the full argument list. The control plane
sends finished commands, so these apply to the config's shards only.
"""

from __future__ import annotations

from collections.abc import Callable

from agent.shard_config import ShardConfig

# What `engines` means when the config does not say: the binaries each engine installs.
DEFAULT_PROBES: dict[str, str | list[str]] = {"vllm": "vllm", "llama.cpp": "llama-server"}


def _port(shard: ShardConfig) -> list[str]:
    return ["--port", str(shard.port)] if shard.port else []


def vllm(prefix: list[str] | None, shard: ShardConfig) -> list[str]:
    # vLLM serves its Prometheus metrics on the API port.
    return [*(prefix or ["vllm"]), "serve", shard.model, *_port(shard), *shard.args]


def llama_cpp(prefix: list[str] | None, shard: ShardConfig) -> list[str]:
    # llama-server exports /metrics only when asked to.
    return [*(prefix or ["llama-server"]), "--model", shard.model, *_port(shard), "--metrics", *shard.args]


def sglang(prefix: list[str] | None, shard: ShardConfig) -> list[str]:
    prefix = prefix or ["python3", "-m", "sglang.launch_server"]
    return [*prefix, "--model-path", shard.model, *_port(shard), "--enable-metrics", *shard.args]


def command(prefix: list[str] | None, shard: ShardConfig) -> list[str]:
    return [*shard.command, *shard.args]


ENGINES: dict[str, Callable[[list[str] | None, ShardConfig], list[str]]] = {
    "vllm": vllm,
    "llama.cpp": llama_cpp,
    "sglang": sglang,
    "command": command,
}
