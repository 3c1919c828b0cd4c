"""Which engines a node must have installed, and whether it has them: the control plane's half of provisioning.

The heartbeat reply's `engines` is `wants(shards)` of the node's placed shards (the
same query `inventory.desired.sync_node` already makes); placement may use a node for
a deployment once `install_state(node, engine)` is ready, and shows the state's detail
as the reason otherwise. The agent reports each install in its inventory's
`provision`, stored as `EngineInstall` rows.
"""

from __future__ import annotations

from collections.abc import Iterable

from agent import engine_templates, protocol
from inventory.models import EngineInstall, Shard

# The engines llmgw installs itself are those it pins a version of; the others
# (demo, command) need nothing, or what the operator put there.
INSTALLED_BY_LLMGW = frozenset(engine_templates.PINNED)


def variant(gpus_per_shard: int) -> str:
    return "cuda" if gpus_per_shard else "cpu"


def wants(shards: Iterable[Shard]) -> list[protocol.EngineWant]:
    """One want per engine and variant among the shards' deployments, at the version llmgw pins (empty)."""
    found = {
        (d.engine, variant(d.gpus_per_shard))
        for d in (shard.replica.deployment for shard in shards)
        if d.engine in INSTALLED_BY_LLMGW
    }
    return [protocol.EngineWant(engine=engine, variant=kind) for engine, kind in sorted(found)]


def install_state(node_id: str, engine: str) -> tuple[str, str]:
    """(state, detail) of `engine` on the node; ("ready", "") for an engine llmgw does not install,
    ("", "") when the node has not reported it yet (not asked, or the request is on its way)."""
    if engine not in INSTALLED_BY_LLMGW:
        return EngineInstall.State.READY, ""
    rows = EngineInstall.objects.filter(node_id=node_id, engine=engine).values_list("state", "detail")
    # One ready variant suffices; else the most hopeful state is the one to show.
    return min(rows, key=lambda row: _HOPE.index(row[0]), default=("", ""))


_HOPE = [
    EngineInstall.State.READY,
    EngineInstall.State.INSTALLING,
    EngineInstall.State.FAILED,
    EngineInstall.State.UNSUPPORTED,
]
