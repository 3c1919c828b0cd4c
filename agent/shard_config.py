"""One shard of the agent's configuration: the engine, model, port and arguments to start it with.

Its own module because `agent.config` parses the YAML into it and the engine kinds
(`agent.enginekinds`) name what `engine` may be.
"""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec

from agent import enginekinds

# Any kind llmgw knows, as its records name them.
EngineName = Literal[enginekinds.NAMES]  # type: ignore[valid-type]


class ShardConfig(msgspec.Struct, forbid_unknown_fields=True):
    shard: str
    engine: EngineName
    model: str = ""
    replica: str = ""
    port: Annotated[int, msgspec.Meta(ge=0, le=65535)] = 0
    args: list[str] = []
    command: list[str] = []
    env: dict[str, str] = {}
