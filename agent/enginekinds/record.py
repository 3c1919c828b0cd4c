"""What an engine kind is: the record each module of this package fills in, and what a shard's command depends on.

Only the standard library: the control plane reads these records as data (the
deployment choices, the commands of placed shards, the Prometheus rules) without the
agent's dependencies, and the agent without Django.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum

# Engines listen on every address: Prometheus and clients reach them from elsewhere.
LISTEN = "0.0.0.0"

# What the control plane sets in a shard's environment: the deployment's secret, which only
# the gateways send (so an engine answers only them), and the key Prometheus scrapes with.
# The agent puts them where its record says the engine reads them; the control plane never
# names an engine's own variables, which the agent's admission would refuse.
API_KEY_ENV = "LLMGW_ENGINE_API_KEY"
SCRAPE_KEY_ENV = "LLMGW_ENGINE_SCRAPE_KEY"


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
    served_name: str = ""  # what clients call the model (the deployment's served model name)
    extra: Sequence[str] = ()  # the operator's own arguments, always last so they win


def serving(launch: Launch) -> list[str]:
    """The flags every HTTP engine of ours takes alike: where it listens.

    One function for all of them, so a flag they all share (an API key, say) is added
    here once, with its field on `Launch`.
    """
    return ["--host", launch.host, *(["--port", str(launch.port)] if launch.port else [])]


@dataclass(frozen=True)
class Template:
    since: str  # the first version these flags apply to
    program: tuple[str, ...]  # the default command prefix; a configured or installed one replaces it
    arguments: Callable[[Launch], list[str]]
    # Fixed words after the program that choose what it runs (`serve`, `-m <module>`): an agent
    # runs a command from the control plane only when it starts with program and lead both.
    lead: tuple[str, ...] = ()


class Signal(StrEnum):
    """llmgw's names: the recorded series, labelled node, shard, replica, model, engine and served_model."""

    REQUESTS_WAITING = "llmgw:shard_queue_depth"
    REQUESTS_RUNNING = "llmgw:shard_requests_running"
    TOKENS_PER_SECOND = "llmgw:shard_tokens_per_second"
    KV_CACHE_USAGE = "llmgw:shard_kv_cache_usage_ratio"


@dataclass(frozen=True)
class Source:
    metric: str
    # A counter is turned into a per-second rate; a gauge is taken as it is.
    counter: bool = False


@dataclass(frozen=True)
class Names:
    since: str  # the first engine version exporting these names
    signals: dict[Signal, Source]


class Readiness(StrEnum):
    """When a started shard counts as running."""

    # llama-server and vLLM open their port before the model is loaded: only /health says it is.
    HEALTH = "GET /health answers 200"
    PORT = "its port accepts connections"


class Installer(StrEnum):
    """How the agent installs an engine (agent/provision/)."""

    PIP_VENV = "pip install into a virtualenv of its own"
    SDIST_BUILD = "build llama-server from the llama-cpp-python sdist"


@dataclass(frozen=True)
class Install:
    method: Installer
    pinned: str  # the version installed when a deployment names none
    default_variant: str  # what a want without a variant means
    package: str = ""  # the PyPI distribution, for PIP_VENV


class StreamUsage(StrEnum):
    """Whether a stream whose client did not ask for usage (`stream_options.include_usage`) still reports it.

    The gateway counts a stream's tokens from the `usage` of its last event, or llama-server's
    `timings` there (deploy/gateway_usage.lua); a stream with neither is not counted.
    """

    ALWAYS = "always"
    FLAG = "always, when started with its flag"
    # Its last event's `timings` carry the counts unasked (llama-server), which the gateway reads.
    TIMINGS = "always, as its timings"
    ASKED = "only when the client asks"  # the gateway counts no other stream


@dataclass(frozen=True)
class UsageInStreams:
    since: str  # the first engine version this applies to
    how: StreamUsage
    # FLAG: what the shard's command line gains (before the operator's own arguments, which win).
    flags: tuple[str, ...] = ()


ASKED_ONLY = UsageInStreams("0", StreamUsage.ASKED)


@dataclass(frozen=True)
class KeyFile:
    """How an engine that reads no variable for its key takes it: from a file of its options.

    The agent writes the file (mode 0600, in its own state directory) and names it on the
    command line with `flag`, so the key never appears in the process's arguments, which
    every user of the node can read in /proc. The file holds one option, `option: "<key>"`
    (YAML; a JSON string is a YAML string).
    """

    flag: str  # the flag naming the file: SGLang's --config
    option: str  # the key's option in the file: api-key
    suffix: str  # the file name's ending the engine insists on: .yaml


@dataclass(frozen=True)
class EngineKind:
    """One engine kind: everything the agent and the control plane know of it."""

    name: str  # as stored in deployments and sent on the wire
    label: str  # as the admin and the pages show it
    # Oldest first; the newest whose `since` is not above the version wins. None: the
    # arguments are the whole command line (`{port}` and `{model}` filled in), and an
    # agent runs one only when its own config allows the program.
    templates: tuple[Template, ...] = ()
    # The binary the agent asks `--version` when its config names none, and the prefix of
    # its config's shards of this kind; empty: not probed.
    probe: tuple[str, ...] = ()
    readiness: Readiness = Readiness.HEALTH
    metrics: tuple[Names, ...] = ()  # oldest first, like the templates
    install: Install | None = None  # None: llmgw installs nothing for it
    placeable: bool = True  # whether the control plane may place deployments of it
    needs_model: bool = True
    # The variable it reads its API key from; empty: it reads API_KEY_ENV itself (or has no key).
    api_key_variable: str = ""
    # Where it reads its key from when no variable does (SGLang: an options file named by --config).
    api_key_file: KeyFile | None = None
    # Whether it keeps /metrics behind that key too, taking a comma-separated list of keys
    # (llama-server): Prometheus' scrape key then joins the deployment's secret.
    metrics_behind_key: bool = False
    # Oldest first, like the templates: how its streams come to report usage to the gateway.
    stream_usage: tuple[UsageInStreams, ...] = (ASKED_ONLY,)
    # Members of a JSON object (no braces) that make its streams carry a running usage on every
    # event, which the gateway's stream relay adds to each streamed request after the client's
    # own (a later member wins): a client gone mid-stream is then counted up to where it left,
    # whether it asked or not (docs/gateway.md, "A client gone mid-stream"). Empty: none known.
    running_usage: str = ""
    # The flag naming the model as clients call it, so that answers name the served model, never
    # the path its weights were loaded from (and engines that check `model` accept the name).
    served_name_flag: str = ""

    @property
    def free_form(self) -> bool:
        return not self.templates

    @property
    def choice_key(self) -> str:
        """The name of its member in the deployments' choices: llama.cpp → LLAMA_CPP."""
        return re.sub(r"[^A-Za-z0-9]", "_", self.name).upper()

    @property
    def pinned(self) -> str:
        return self.install.pinned if self.install else ""

    def template(self, version: str = "") -> Template:
        """The template for `version` (empty: the pinned one). ValueError for a free-form kind."""
        if self.free_form:
            raise ValueError(f"{self.name} has no template: its arguments are the whole command line")
        key = version_key(version or self.pinned)
        if not key:
            return self.templates[-1]
        return [t for t in self.templates if version_key(t.since) <= key][-1]

    def command_line(self, launch: Launch, version: str = "", prefix: Sequence[str] | None = None) -> list[str]:
        """The full command line of one shard; `prefix` (a configured or installed binary) replaces the program."""
        if self.free_form:
            words = [*(prefix or ()), *launch.extra]
            return [word.replace("{port}", str(launch.port)).replace("{model}", launch.model) for word in words]
        chosen = self.template(version)
        usage = self.usage_in_streams(version)
        named = [self.served_name_flag, launch.served_name] if self.served_name_flag and launch.served_name else []
        return [
            *(prefix or chosen.program), *chosen.lead, *chosen.arguments(launch), *named, *usage.flags, *launch.extra
        ]  # fmt: skip

    def runs(self, command: Sequence[str], allowed_programs: Sequence[str] = ()) -> bool:
        """Whether an agent may execute `command` as a shard of this kind.

        A templated kind runs only what one of its templates starts with (program and
        lead): the program comes from this record, never from whoever sent the command.
        A free-form kind runs only a program the node's own config allows, by exact name.
        """
        if not command:
            return False
        if self.free_form:
            return command[0] in allowed_programs
        starts = ((*t.program, *t.lead) for t in self.templates)
        return any(tuple(command[: len(start)]) == start for start in starts)

    def environment(self, env: Mapping[str, str]) -> dict[str, str]:
        """`env` with the shard's API key also where this engine reads it."""
        out = dict(env)
        key = out.get(API_KEY_ENV, "")
        if key and self.api_key_variable:
            scrape = out.get(SCRAPE_KEY_ENV, "")
            out[self.api_key_variable] = f"{key},{scrape}" if scrape and self.metrics_behind_key else key
        return out

    def usage_in_streams(self, version: str = "") -> UsageInStreams:
        """How its streams report usage at `version` (empty: the pinned one, else the newest known)."""
        key = version_key(version or self.pinned)
        chosen = [u for u in self.stream_usage if not key or version_key(u.since) <= key]
        return chosen[-1] if chosen else ASKED_ONLY

    def key_file_text(self, env: Mapping[str, str]) -> str:
        """What the agent writes to the shard's key file: "" when this kind reads no key file or `env` holds no key.

        ValueError for a key the engine would misread: SGLang turns the file back into
        command-line words, where a key starting with "-" reads as a flag.
        """
        key = env.get(API_KEY_ENV, "")
        if not key or self.api_key_file is None:
            return ""
        if key.startswith("-") or any(c in key for c in "\x00\r\n"):
            raise ValueError(f"{self.label} cannot take an API key that starts with '-' or holds a line break")
        return f"{self.api_key_file.option}: {json.dumps(key)}\n"

    def with_key_file(self, command: Sequence[str], path: str) -> list[str]:
        """`command` naming the key file `path`; ValueError when the command names a file of options already."""
        if self.api_key_file is None:
            return list(command)
        flag = self.api_key_file.flag
        if any(word == flag or word.startswith(f"{flag}=") for word in command):
            raise ValueError(
                f"{self.label} reads one {flag} file, and llmgw puts the engine's API key in it: "
                f"give the options in the deployment's arguments instead of {flag}"
            )
        return [*command, flag, path]

    def metric_names(self, version: str = "") -> dict[Signal, Source]:
        """The signals it exports at `version` (empty: the newest known); {} when it exports none llmgw reads."""
        key = version_key(version)
        chosen = [n for n in self.metrics if not key or version_key(n.since) <= key]
        return dict(chosen[-1].signals) if chosen else {}


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
