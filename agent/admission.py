"""What the agent agrees to run from the control plane's reply: rules no reply can bend.

A reply (or the shard list the control plane cached in Redis and sent on) carries
whole commands and environments, and names versions that become directories. Whoever
can write it must not get to run anything on the node, so the agent decides:

- the program comes from the shard's engine kind (`agent.enginekinds`): a command must
  start with what one of the kind's templates starts with, and a free-form kind
  (`command`) may run only a program the node's own config lists in `command_programs`;
- a model given as a path lies inside the node's `model_dirs`, and so does every path
  among a templated engine's arguments;
- the environment names only what the control plane sets (`SHARD_ENV`, `LLMGW_*`),
  never `PATH`, `LD_PRELOAD` or `PYTHONPATH`; no argument or value holds a NUL byte
  (which would stop the process from being started at all);
- an engine name, version or variant is one plain word, checked before any path is built
  from it (a version `../../etc/ssl/private/x` would otherwise be removed with rmtree).

A refusal is a reason in words; the agent reports a refused shard as failed with it.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from agent import enginekinds, protocol

# The variables the control plane sets on a shard (inventory/desired.py), besides its own LLMGW_*.
SHARD_ENV = frozenset({"CUDA_VISIBLE_DEVICES", "NCCL_IB_HCA"})
SHARD_ENV_PREFIX = "LLMGW_"
_ENV_NAME = re.compile(r"^[A-Z][A-Z0-9_]*\Z")
# A version or variant: letters, digits and . _ + -, starting with a letter or digit: never a path.
_WORD = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+-]{0,63}\Z")


@dataclass(frozen=True)
class Allowed:
    """What the node's own config allows: where models may be, and which free-form programs may run."""

    model_dirs: tuple[str, ...] = ()
    command_programs: tuple[str, ...] = ()


def plain_word(value: str) -> bool:
    """Whether `value` may name a version or variant, and so a directory: no '/', no '..'."""
    return bool(_WORD.match(value)) and ".." not in value


def want_refusal(engine: str, version: str, variant: str) -> str | None:
    """Why an engine want must not even be tried, or None: its words become directories."""
    for field, value in (("engine", engine), ("version", version), ("variant", variant)):
        if value and not plain_word(value):
            return f"refused: the {field} {value!r} is not a plain word (letters, digits, . _ + -)"
    return None


def shard_refusal(spec: protocol.ShardSpec, allowed: Allowed) -> str | None:
    """Why the agent will not run `spec`, or None when it may."""
    kind = enginekinds.BY_NAME.get(spec.engine)
    if kind is None:
        return f"refused: llmgw knows no engine {spec.engine!r}"
    if len(spec.command) > protocol.MAX_ARGS:
        return f"refused: more than {protocol.MAX_ARGS} arguments"
    if not kind.runs(spec.command, allowed.command_programs):
        if kind.free_form:
            program = spec.command[0] if spec.command else ""
            return f"refused: {program!r} is not among this node's command_programs"
        return f"refused: the command does not start with a program of the {kind.name} engine"
    if any("\x00" in word for word in (*spec.command, spec.model, *spec.env.values())):
        return "refused: an argument or value holds a NUL byte"
    for name in spec.env:
        if not env_allowed(name):
            return f"refused: the environment variable {name!r} is not one the control plane sets"
    paths = {spec.model} if spec.model.startswith("/") else set()
    if not kind.free_form:
        # A free-form program's arguments are the deployment the node's operator allowed it for.
        paths.update(path for word in spec.command for path in _paths_in(word))
    for path in sorted(paths):
        if not inside(path, allowed.model_dirs):
            return f"refused: {path!r} is outside this node's model_dirs"
    return None


def env_allowed(name: str) -> bool:
    return bool(_ENV_NAME.match(name)) and (name in SHARD_ENV or name.startswith(SHARD_ENV_PREFIX))


def _paths_in(word: str) -> Iterable[str]:
    # A path as a word of its own, or as a flag's value (--model=/m/x).
    if word.startswith("/"):
        yield word
    elif word.startswith("-") and "=/" in word:
        yield word.split("=", 1)[1]


def inside(path: str, dirs: Sequence[str]) -> bool:
    """Whether `path`, with `..` and symbolic links resolved, lies in one of `dirs`."""
    real = Path(os.path.realpath(path))
    return any(real.is_relative_to(os.path.realpath(d)) for d in dirs if d)
