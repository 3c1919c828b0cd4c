"""llama.cpp's llama-server, built by the agent from the llama.cpp vendored in llama-cpp-python.

Versions are llama-cpp-python's, whose vendored llama.cpp is built (agent/provision/llama_cpp.py).
"""

from __future__ import annotations

from agent.enginekinds.record import (
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


def _server(launch: Launch) -> list[str]:
    # llama-server exports /metrics only when asked to.
    argv = ["--model", launch.model, *serving(launch), "--metrics"]
    if launch.threads:
        argv += ["--threads", str(launch.threads)]
    if launch.parallel:
        argv += ["--parallel", str(launch.parallel)]
    if launch.gpus:
        # Every layer on the GPU; llama-server caps the number at the model's layers.
        argv += ["--n-gpu-layers", "999"]
    return argv


KIND = EngineKind(
    name="llama.cpp",
    label="llama.cpp (llama-server)",
    templates=(Template("0", ("llama-server",), _server),),
    probe=("llama-server",),
    # The server of 0.3.36 exports no KV-cache gauge (kv_cache_usage_ratio was removed upstream);
    # its predicted_tokens_seconds is the mean speed of the requests since the last scrape,
    # not the server's output, so tokens per second come from the counter.
    metrics=(
        Names(
            "0",
            {
                Signal.REQUESTS_WAITING: Source("llamacpp:requests_deferred"),
                Signal.REQUESTS_RUNNING: Source("llamacpp:requests_processing"),
                Signal.TOKENS_PER_SECOND: Source("llamacpp:tokens_predicted_total", counter=True),
            },
        ),
    ),
    install=Install(Installer.SDIST_BUILD, pinned="0.3.36", default_variant="cpu"),
    api_key_variable="LLAMA_API_KEY",
    served_name_flag="--alias",
    metrics_behind_key=True,
    # The server of 0.3.36 ends a chat stream with usage only when asked, and has no flag to
    # make it (tools/server/server-task.cpp, to_json_oaicompat_chat_stream); its /v1/completions
    # streams always end with it, and every stream's last event has its `timings`.
    stream_usage=(UsageInStreams("0", StreamUsage.TIMINGS),),
    # Running `timings` on every event, chat streams and completions alike (read by the gateway as usage).
    running_usage='"timings_per_token":true',
)
