"""Every engine kind llmgw knows, one record each: adding an engine is one module here and its tests.

A record (`record.EngineKind`) holds the kind's program and version probe, its command
templates by version, when a shard of it is ready, its metric names, how the agent
installs it, and whether the control plane may place it. Everything else is derived
from `KINDS`: the agent's config type (`agent.shard_config`), what it installs
(`agent.provision`) and what it agrees to run (`agent.admission`); the deployments'
choices (`inventory.models.deployments.Engine`), the commands of placed shards
(`inventory.desired`) and the Prometheus rules (`agent.enginekinds.rules`). A test
(tests/test_engine_kinds.py) checks that no other module names a kind.

Pure data and the standard library only, so the control plane imports it like
`agent.protocol` (the import contracts put both at the bottom).
"""

from __future__ import annotations

from collections.abc import Sequence

from agent.enginekinds import command, demo, llama_cpp, sglang, vllm
from agent.enginekinds.record import (
    API_KEY_ENV,
    SCRAPE_KEY_ENV,
    EngineKind,
    Installer,
    Launch,
    Readiness,
    Signal,
    Source,
    version_key,
)

__all__ = [
    "API_KEY_ENV",
    "KINDS",
    "NAMES",
    "SCRAPE_KEY_ENV",
    "EngineKind",
    "Installer",
    "Launch",
    "Readiness",
    "Signal",
    "Source",
    "command_line",
    "get",
    "version_key",
]

# In the order the admin lists them.
KINDS: tuple[EngineKind, ...] = (vllm.KIND, llama_cpp.KIND, sglang.KIND, demo.KIND, command.KIND)
BY_NAME: dict[str, EngineKind] = {kind.name: kind for kind in KINDS}
NAMES: tuple[str, ...] = tuple(BY_NAME)


def get(name: str) -> EngineKind:
    """The record of `name`; KeyError for a kind llmgw does not know."""
    return BY_NAME[name]


def command_line(engine: str, launch: Launch, version: str = "", prefix: Sequence[str] | None = None) -> list[str]:
    """The full command line of one shard of `engine` (see `EngineKind.command_line`)."""
    return get(engine).command_line(launch, version, prefix)
