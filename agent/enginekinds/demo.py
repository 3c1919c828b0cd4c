"""The stand-in engine (agent/demo_engine.py): an OpenAI-like server that needs no model or GPU.

It ships with the agent, so nothing is installed; it exports vLLM's names, but no KV cache,
and ends every stream with its usage when started as vLLM is (`--enable-force-include-usage`).
"""

from __future__ import annotations

from dataclasses import replace

from agent.enginekinds.record import EngineKind, Launch, Names, Signal, Template, serving
from agent.enginekinds.vllm import CONTINUOUS_USAGE, FORCED_USAGE
from agent.enginekinds.vllm import METRICS as VLLM_METRICS


def _server(launch: Launch) -> list[str]:
    return [*serving(launch), "--model", launch.model]


KIND = EngineKind(
    name="demo",
    label="demo (stand-in engine, no model needed)",
    templates=(Template("0", ("python3",), _server, lead=("-m", "agent.demo_engine")),),
    metrics=(Names("0", {k: v for k, v in VLLM_METRICS.items() if k != Signal.KV_CACHE_USAGE}),),
    stream_usage=(replace(FORCED_USAGE, since="0"),),
    running_usage=CONTINUOUS_USAGE,
    served_name_flag="--served-model-name",
)
