"""Each engine's command line, defined once: the agent (its config's shards) and the control plane
(placed shards) both build commands here, so an engine cannot start one way from one and
another way from the other.

A template is chosen by engine and version: the newest template whose `since` is not above
the version wins; an empty version means the version llmgw pins (`PINNED`). This module
imports only the standard library, so the control plane can use it without the agent's
dependencies and the agent without Django.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

# Engines listen on every address: Prometheus and clients reach them from elsewhere.
LISTEN = "0.0.0.0"

# The version installed when a deployment names none. For llama.cpp it is the
# llama-cpp-python release whose vendored llama.cpp is built (see agent/provision/).
PINNED: dict[str, str] = {"llama.cpp": "0.3.36", "vllm": "0.11.0", "sglang": "0.5.3"}


@dataclass(frozen=True)
class Launch:
    """What a shard's command depends on, whichever side builds it."""

    model: str
    port: int = 0
    host: str = LISTEN
    threads: int = 0  # CPU engines: cores the shard may use; 0 lets the engine choose
    parallel: int = 0  # llama.cpp: concurrent request slots; 0 lets the engine choose
    gpus: int = 0  # GPUs of this shard (tensor parallelism)
    shards: int = 1  # shards of the replica (pipeline parallelism across nodes)
    shard_index: int = 0
    leader: str = ""  # host:port of shard 0, where the other shards of the replica join it
    extra: Sequence[str] = ()  # the operator's own arguments, always last so they win


@dataclass(frozen=True)
class Template:
    since: str  # the first version these flags apply to
    program: tuple[str, ...]  # the default command prefix; a configured or installed one replaces it
    arguments: Callable[[Launch], list[str]]


def _listen(launch: Launch) -> list[str]:
    return ["--host", launch.host, *(["--port", str(launch.port)] if launch.port else [])]


def _vllm(launch: Launch) -> list[str]:
    # vLLM serves its Prometheus metrics on the API port, without being asked.
    argv = ["serve", launch.model, *_listen(launch)]
    if launch.gpus > 1:
        argv += ["--tensor-parallel-size", str(launch.gpus)]
    if launch.shards > 1:
        argv += ["--pipeline-parallel-size", str(launch.shards)]
    return argv


def _vllm_before_serve(launch: Launch) -> list[str]:
    # Before `vllm serve` existed the OpenAI server was a module taking the model as --model.
    argv = ["-m", "vllm.entrypoints.openai.api_server", "--model", *_vllm(launch)[1:]]
    return argv


def _sglang(launch: Launch) -> list[str]:
    # Without --enable-metrics SGLang exports nothing, and its shards would chart as empty.
    argv = ["--model-path", launch.model, *_listen(launch), "--enable-metrics"]
    if launch.gpus > 1:
        argv += ["--tp-size", str(launch.gpus)]
    if launch.shards > 1:
        argv += ["--nnodes", str(launch.shards), "--node-rank", str(launch.shard_index)]
        argv += ["--dist-init-addr", launch.leader]
    return argv


def _llama_cpp(launch: Launch) -> list[str]:
    # llama-server exports /metrics only when asked to.
    argv = ["--model", launch.model, *_listen(launch), "--metrics"]
    if launch.threads:
        argv += ["--threads", str(launch.threads)]
    if launch.parallel:
        argv += ["--parallel", str(launch.parallel)]
    if launch.gpus:
        # Every layer on the GPU; llama-server caps the number at the model's layers.
        argv += ["--n-gpu-layers", "999"]
    return argv


def _demo(launch: Launch) -> list[str]:
    return ["-m", "agent.demo_engine", *_listen(launch), "--model", launch.model]


TEMPLATES: dict[str, tuple[Template, ...]] = {
    # Oldest first.
    "vllm": (
        Template("0", ("python3",), _vllm_before_serve),
        Template("0.5.0", ("vllm",), _vllm),
    ),
    "sglang": (Template("0", ("python3", "-m", "sglang.launch_server"), _sglang),),
    "llama.cpp": (Template("0", ("llama-server",), _llama_cpp),),
    "demo": (Template("0", ("python3",), _demo),),
}

# The environment variables engines read their API key from (llama-server, vLLM; the demo engine
# and a "command" engine read LLMGW_ENGINE_API_KEY). Set from the deployment's secret, so an engine
# answers only requests that carry it: the gateway's.
API_KEY_VARIABLES = ("LLMGW_ENGINE_API_KEY", "LLAMA_API_KEY", "VLLM_API_KEY")


def api_key_env(secret: str, scrape_key: str = "") -> dict[str, str]:
    """The variables for one shard. llama-server keeps /metrics behind its key as well (vLLM does not), and
    takes a comma-separated list: Prometheus' scrape key joins the deployment's secret there."""
    env = dict.fromkeys(API_KEY_VARIABLES, secret)
    if scrape_key:
        env["LLAMA_API_KEY"] = f"{secret},{scrape_key}"
    return env


# The "command" engine: the arguments are the whole command line, with {port} and {model} filled in.
COMMAND = "command"
ENGINES = (*TEMPLATES, COMMAND)


def version_key(version: str) -> tuple[int, ...]:
    """ "0.10.1rc2" → (0, 10, 1): the leading numbers, which is all the templates compare."""
    numbers = []
    for part in version.strip().lstrip("v").split("."):
        digits = re.match(r"\d+", part)
        if digits is None:
            break
        numbers.append(int(digits.group()))
        if digits.group() != part:
            break
    return tuple(numbers)


def template(engine: str, version: str = "") -> Template:
    """The template for `engine` at `version` (empty: the pinned one). KeyError for an unknown engine."""
    templates = TEMPLATES[engine]
    key = version_key(version or PINNED.get(engine, ""))
    if not key:
        return templates[-1]
    return [t for t in templates if version_key(t.since) <= key][-1]


def command(engine: str, launch: Launch, version: str = "", prefix: Sequence[str] | None = None) -> list[str]:
    """The full command line of one shard; `prefix` (a configured or installed binary) replaces the program."""
    if engine == COMMAND:
        words = [*(prefix or ()), *launch.extra]
        return [word.replace("{port}", str(launch.port)).replace("{model}", launch.model) for word in words]
    chosen = template(engine, version)
    return [*(prefix or chosen.program), *chosen.arguments(launch), *launch.extra]
