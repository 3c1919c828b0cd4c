"""SGLang: its launch_server module, installed with pip; metrics only with --enable-metrics.

SGLang reads no variable for its API key, only `--api-key` (visible to every user of the
node in /proc/PID/cmdline), or the same option from the YAML file `--config` names
(python/sglang/srt/server_args_config_parser.py, in SGLang since 0.5.3): the agent
writes the key there. /health and /metrics stay open without it.
"""

from __future__ import annotations

from agent.enginekinds.record import (
    ASKED_ONLY,
    EngineKind,
    Install,
    Installer,
    KeyFile,
    Launch,
    Names,
    Signal,
    Source,
    StreamUsage,
    Template,
    UsageInStreams,
    serving,
)
from agent.enginekinds.vllm import CONTINUOUS_USAGE


def _launch_server(launch: Launch) -> list[str]:
    # Without --enable-metrics SGLang exports nothing, and its shards would chart as empty.
    argv = ["--model-path", launch.model, *serving(launch), "--enable-metrics"]
    if launch.gpus > 1:
        argv += ["--tp-size", str(launch.gpus)]
    if launch.shards > 1:
        argv += ["--nnodes", str(launch.shards), "--node-rank", str(launch.shard_index)]
        argv += ["--dist-init-addr", launch.leader]
    return argv


KIND = EngineKind(
    name="sglang",
    label="SGLang",
    templates=(Template("0", ("python3", "-m", "sglang.launch_server"), _launch_server),),
    metrics=(
        Names(
            "0",
            {
                Signal.REQUESTS_WAITING: Source("sglang:num_queue_reqs"),
                Signal.REQUESTS_RUNNING: Source("sglang:num_running_reqs"),
                Signal.TOKENS_PER_SECOND: Source("sglang:gen_throughput"),
                Signal.KV_CACHE_USAGE: Source("sglang:token_usage"),
            },
        ),
    ),
    install=Install(Installer.PIP_VENV, pinned="0.5.3", default_variant="cuda", package="sglang"),
    # The flag came in 0.5.10 (server_args.py); before, a stream reports usage only when asked.
    stream_usage=(
        ASKED_ONLY,
        UsageInStreams("0.5.10", StreamUsage.FLAG, ("--stream-response-default-include-usage",)),
    ),
    running_usage=CONTINUOUS_USAGE,
    # Only `--config FILE` as two words is read (0.5.3 looks for the word itself), and the file
    # must end in .yaml or .yml.
    api_key_file=KeyFile(flag="--config", option="api-key", suffix=".yaml"),
    served_name_flag="--served-model-name",
)
