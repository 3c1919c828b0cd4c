"""A placed shard's engine command, from the templates the agent uses too (`agent.engine_templates`).

`inventory.desired.command` should be this function: one home for every engine's flags.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from agent import engine_templates

if TYPE_CHECKING:
    from inventory.models import Deployment, Shard


def launch(deployment: Deployment, shard: Shard, leader: str = "") -> engine_templates.Launch:
    """What the shard's command depends on, read from its deployment's profile and its placement."""
    return engine_templates.Launch(
        model=deployment.model_source,
        port=shard.port,
        threads=deployment.cpu_cores_per_shard,
        gpus=deployment.gpus_per_shard,
        shards=deployment.shards_per_replica,
        shard_index=shard.index,
        leader=leader,
        extra=tuple(deployment.argv()),
    )


def command(deployment: Deployment, shard: Shard, leader: str = "") -> list[str]:
    """The engine's command line for one shard, at the version llmgw pins for its engine."""
    return engine_templates.command(deployment.engine, launch(deployment, shard, leader))
