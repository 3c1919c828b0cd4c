"""Command templates: how each engine is started for a shard of the config.

A template takes the engine's command prefix (from the config's `engines`, else the
usual binary) and the shard, and returns the full argument list, built by
`agent.engine_templates` like the control plane's commands. The control plane
sends finished commands, so these apply to the config's shards only.
"""

from __future__ import annotations

from collections.abc import Callable

from agent import engine_templates
from agent.shard_config import ShardConfig

# What `engines` means when the config does not say: the binaries each engine installs.
DEFAULT_PROBES: dict[str, str | list[str]] = {"vllm": "vllm", "llama.cpp": "llama-server"}


def _template(engine: str) -> Callable[[list[str] | None, ShardConfig], list[str]]:
    def build(prefix: list[str] | None, shard: ShardConfig) -> list[str]:
        launch = engine_templates.Launch(model=shard.model, port=shard.port, extra=tuple(shard.args))
        return engine_templates.command(engine, launch, prefix=prefix)

    return build


def command(prefix: list[str] | None, shard: ShardConfig) -> list[str]:
    return engine_templates.command(
        engine_templates.COMMAND,
        engine_templates.Launch(model=shard.model, port=shard.port, extra=tuple(shard.args)),
        prefix=shard.command,
    )


ENGINES: dict[str, Callable[[list[str] | None, ShardConfig], list[str]]] = {
    "vllm": _template("vllm"),
    "llama.cpp": _template("llama.cpp"),
    "sglang": _template("sglang"),
    "command": command,
}
