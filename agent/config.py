"""The agent's YAML configuration: every key, its type, and the one-line error for a bad one.

Key names are fixed in docs/design.md ("Fixed points") and documented in docs/agent.md; tests read each
of them from a file, because a key that binds to nothing fails silently otherwise.
"""

from __future__ import annotations

import hashlib
import re
import socket
from pathlib import Path
from typing import Annotated

import msgspec
import yaml

from agent import enginekinds, protocol
from agent.shard_config import ShardConfig
from llmgw_transport import InsecureUrl, check_url

# \Z, not $: $ would also match before a final newline.
_NODE_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:-]*\Z")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*\Z")

Command = str | list[str]


class ConfigError(Exception):
    """A configuration the agent cannot run with; the message is one line naming the key."""


class _Strict(msgspec.Struct, forbid_unknown_fields=True):
    pass


class FabricConfig(_Strict):
    name: Annotated[str, msgspec.Meta(min_length=1, max_length=protocol.MAX_TEXT)]
    hcas: Annotated[
        list[Annotated[str, msgspec.Meta(min_length=1, max_length=protocol.MAX_TEXT)]],
        msgspec.Meta(min_length=1, max_length=protocol.MAX_HCAS),
    ]
    rate_gbps: Annotated[int, msgspec.Meta(ge=0, le=100_000)] | None = None


class Config(_Strict):
    control_plane: str
    # Plain http:// to a host other than loopback only when said by name: the replies say what this node runs.
    allow_insecure_http: bool = False
    # The certificate authority that signs the control plane's certificate; empty: the system's.
    ca_file: str = ""
    node_id: str = ""
    join_token: str = ""
    join_token_file: str = ""
    state_dir: str = "/var/lib/llmgw-agent"
    interval: Annotated[float, msgspec.Meta(gt=0, le=3600)] = 5.0
    labels: dict[str, str] = {}
    model_dirs: list[str] = []
    fabrics: Annotated[list[FabricConfig], msgspec.Meta(max_length=protocol.MAX_FABRICS)] = []
    engines: (
        Annotated[
            dict[Annotated[str, msgspec.Meta(max_length=protocol.MAX_TEXT)], Command],
            msgspec.Meta(max_length=protocol.MAX_ENGINES),
        ]
        | None
    ) = None
    shards: Annotated[list[ShardConfig], msgspec.Meta(max_length=protocol.MAX_SHARDS)] = []
    env: dict[str, str] = {}
    # Where engines get cgroups of their own: "" finds the agent's delegated cgroup, "none" uses none.
    cgroup_root: str = ""
    # Where engine builds are kept for every agent on the machine; empty: ~/.cache/llmgw/engines.
    engine_cache: str = ""
    # The programs a `command` shard from the control plane may run, by exact name; empty: none.
    command_programs: Annotated[list[str], msgspec.Meta(max_length=protocol.MAX_ENGINES)] = []

    @property
    def engine_commands(self) -> dict[str, list[str]]:
        """Each engine's command prefix: the configured one, else the binary its kind probes."""
        given = default_probes() if self.engines is None else self.engines
        return {name: [cmd] if isinstance(cmd, str) else list(cmd) for name, cmd in given.items()}

    def read_join_token(self) -> str:
        """The join token, re-read from its file each time so an operator can fix it without a restart."""
        if self.join_token:
            return self.join_token
        try:
            return Path(self.join_token_file).read_text().strip()
        except OSError as exc:
            raise ConfigError(f"join_token_file: cannot read {self.join_token_file}: {exc.strerror}") from None


KEYS = tuple(Config.__struct_fields__)


def default_probes() -> dict[str, str | list[str]]:
    """What `engines` means when the config does not say: the binaries the kinds usually install."""
    return {kind.name: list(kind.probe) for kind in enginekinds.KINDS if kind.probe}


def load(path: str | Path) -> Config:
    """Read and check the file; raise ConfigError with one line naming the key at fault."""
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise ConfigError(f"cannot read {path}: {exc.strerror}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark else ""
        raise ConfigError(f"not valid YAML{where}: {getattr(exc, 'problem', exc)}") from None
    return from_mapping(data if data is not None else {})


def from_mapping(data: object) -> Config:
    if not isinstance(data, dict):
        raise ConfigError("the file must be a mapping of keys to values")
    unknown = sorted(str(key) for key in data if key not in KEYS)
    if unknown:
        raise ConfigError(f"{unknown[0]}: unknown key (known keys: {', '.join(KEYS)})")
    if "control_plane" not in data:
        raise ConfigError("control_plane: required, the URL of the control plane (https://host:port)")
    try:
        config = msgspec.convert(data, Config)
    except msgspec.ValidationError as exc:
        raise ConfigError(_describe(exc)) from None
    _check(config)
    if not config.node_id:
        config.node_id = default_node_id()
    return config


def _describe(exc: msgspec.ValidationError) -> str:
    # msgspec says "Expected `int`, got `str` - at `$.shards[0].port`"; lead with the key.
    message, _, where = str(exc).rpartition(" - at ")
    if not message:
        return str(exc)
    key = where.strip("`").removeprefix("$.").replace("[...]", "")
    return f"{key}: {message[0].lower()}{message[1:]}"


def _check(config: Config) -> None:
    try:
        check_url(config.control_plane, config.allow_insecure_http)
    except InsecureUrl as exc:
        raise ConfigError(f"control_plane: {exc}") from None
    if config.ca_file and not Path(config.ca_file).is_file():
        raise ConfigError(f"ca_file: no such file {config.ca_file}")
    if config.node_id and not valid_id(config.node_id):
        raise ConfigError("node_id: expected letters, digits and . _ : - (starting with a letter or digit)")
    if config.join_token and config.join_token_file:
        raise ConfigError("join_token_file: give join_token or join_token_file, not both")
    if not config.join_token and not config.join_token_file:
        raise ConfigError("join_token: required (or join_token_file, a file holding it)")
    if config.join_token_file and not Path(config.join_token_file).is_file():
        raise ConfigError(f"join_token_file: no such file {config.join_token_file}")
    if not config.state_dir:
        raise ConfigError("state_dir: expected a directory path")
    try:
        protocol.decode(protocol.encoder.encode(config.labels), protocol.Labels)
    except msgspec.ValidationError as exc:
        raise ConfigError(f"labels: {exc}") from None
    for name in config.env:
        if not _ENV_NAME.match(name):
            raise ConfigError(f"env: {name!r} is not an environment variable name")
    for name, command in config.engine_commands.items():
        if not command or not all(command):
            raise ConfigError(f"engines.{name}: expected a binary or a non-empty list of arguments")
    for program in config.command_programs:
        if not program or "\x00" in program:
            raise ConfigError(f"command_programs: expected program names or paths, got {program!r}")
    seen = set()
    for i, shard in enumerate(config.shards):
        where = f"shards[{i}]"
        if not valid_id(shard.shard):
            raise ConfigError(f"{where}.shard: expected letters, digits and . _ : - (starting with a letter or digit)")
        if shard.shard in seen:
            raise ConfigError(f"{where}.shard: {shard.shard!r} is given twice")
        seen.add(shard.shard)
        kind = enginekinds.get(shard.engine)
        if kind.free_form and not shard.command:
            raise ConfigError(f"{where}.command: required when engine is {kind.name}")
        if kind.needs_model and not shard.model:
            raise ConfigError(f"{where}.model: required for engine {kind.name}")
        if not kind.free_form and shard.command:
            raise ConfigError(f"{where}.command: only for free-form engines; use args to add to {kind.name}'s")
    names = [fabric.name for fabric in config.fabrics]
    if len(set(names)) != len(names):
        raise ConfigError("fabrics: a fabric name is given twice")


def valid_id(value: str) -> bool:
    """Whether `value` can name a node or shard on the wire (protocol.NodeId)."""
    return 0 < len(value) <= protocol.MAX_ID and bool(_NODE_ID.match(value))


def shard_specs(config: Config) -> list[protocol.ShardSpec]:
    """The configured shards, as the same specs the control plane sends."""
    return [
        protocol.ShardSpec(
            shard=shard.shard,
            replica=shard.replica or shard.shard,
            model=shard.model,
            engine=shard.engine,
            command=configured_command(config, shard),
            env=dict(shard.env),
            port=shard.port,
        )
        for shard in config.shards
    ]


def configured_command(config: Config, shard: ShardConfig) -> list[str]:
    """A configured shard's command line: its kind's template, with the configured binary as the program."""
    kind = enginekinds.get(shard.engine)
    prefix = shard.command if kind.free_form else config.engine_commands.get(kind.name)
    launch = enginekinds.Launch(model=shard.model, port=shard.port, extra=tuple(shard.args))
    return kind.command_line(launch, prefix=prefix)


def default_node_id(etc: Path = Path("/etc")) -> str:
    """Stable across restarts and reinstalls of the agent: from /etc/machine-id, else the hostname.

    The machine id is hashed because systemd asks applications not to expose it.
    """
    try:
        machine_id = (etc / "machine-id").read_text().strip()
    except OSError:
        machine_id = ""
    if machine_id:
        return "m-" + hashlib.sha256(f"llmgw-node:{machine_id}".encode()).hexdigest()[:16]
    hostname = re.sub(r"[^A-Za-z0-9._:-]", "-", socket.gethostname()).lstrip("._:-")
    return (hostname or "node")[: protocol.MAX_ID]
