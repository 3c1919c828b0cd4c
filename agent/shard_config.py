"""One shard of the agent's configuration: the engine, model, port and arguments to start it with.

Its own module because two others read it: `agent.config` parses the YAML into it, and
`agent.engines` turns it into a command line. Both import it; neither imports the other's way back.
"""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec


class ShardConfig(msgspec.Struct, forbid_unknown_fields=True):
    shard: str
    engine: Literal["vllm", "llama.cpp", "sglang", "command"]
    model: str = ""
    replica: str = ""
    port: Annotated[int, msgspec.Meta(ge=0, le=65535)] = 0
    args: list[str] = []
    command: list[str] = []
    env: dict[str, str] = {}
