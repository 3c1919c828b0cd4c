"""vLLM: `vllm serve`, installed with pip; its metrics on the API port, without being asked."""

from __future__ import annotations

from agent.enginekinds.record import (
    ASKED_ONLY,
    EngineKind,
    Install,
    Installer,
    Launch,
    Names,
    Signal,
    Source,
    StreamUsage,
    Template,
    UsageInStreams,
    serving,
)


def _parallelism(launch: Launch) -> list[str]:
    argv = []
    if launch.gpus > 1:
        argv += ["--tensor-parallel-size", str(launch.gpus)]
    if launch.shards > 1:
        argv += ["--pipeline-parallel-size", str(launch.shards)]
    return argv


def _serve(launch: Launch) -> list[str]:
    return [launch.model, *serving(launch), *_parallelism(launch)]


def _before_serve(launch: Launch) -> list[str]:
    # Before `vllm serve` existed the OpenAI server was a module taking the model as --model.
    return ["--model", launch.model, *serving(launch), *_parallelism(launch)]


METRICS_BEFORE_0_10 = {
    Signal.REQUESTS_WAITING: Source("vllm:num_requests_waiting"),
    Signal.REQUESTS_RUNNING: Source("vllm:num_requests_running"),
    Signal.TOKENS_PER_SECOND: Source("vllm:generation_tokens_total", counter=True),
    # A fraction despite its name: 1 is a full cache.
    Signal.KV_CACHE_USAGE: Source("vllm:gpu_cache_usage_perc"),
}
METRICS = {**METRICS_BEFORE_0_10, Signal.KV_CACHE_USAGE: Source("vllm:kv_cache_usage_perc")}

# --enable-force-include-usage (0.9.2) ended every stream with its usage only when the request had
# stream_options; from 0.11.1 also without (vllm/entrypoints/utils.py, should_include_usage). From
# 0.19.0 it also puts the running usage on every event, which the gateway counts as it passes.
FORCED_USAGE = UsageInStreams("0.11.1", StreamUsage.FLAG, ("--enable-force-include-usage",))
STREAM_USAGE = (ASKED_ONLY, FORCED_USAGE)
# A running usage on every event of the stream, when the request asks (from 0.6.0): the stream's
# usage so far, which the gateway counts as it passes. SGLang's and the demo engine's are the same.
CONTINUOUS_USAGE = '"stream_options":{"include_usage":true,"continuous_usage_stats":true}'

KIND = EngineKind(
    name="vllm",
    label="vLLM",
    templates=(
        Template("0", ("python3",), _before_serve, lead=("-m", "vllm.entrypoints.openai.api_server")),
        Template("0.5.0", ("vllm",), _serve, lead=("serve",)),
    ),
    probe=("vllm",),
    metrics=(Names("0", METRICS_BEFORE_0_10), Names("0.10.0", METRICS)),
    install=Install(Installer.PIP_VENV, pinned="0.11.0", default_variant="cuda", package="vllm"),
    api_key_variable="VLLM_API_KEY",
    stream_usage=STREAM_USAGE,
    running_usage=CONTINUOUS_USAGE,
    served_name_flag="--served-model-name",
)
