"""Which engines a node must have installed, and whether it has them: the control plane's half of provisioning.

The heartbeat reply's `engines` is `wants(shards)` of the node's placed shards (the
same query `inventory.desired.orders` already makes); placement may use a node for
a deployment unless `blocked_installs` names the engine there, and shows its detail
as the reason. The agent reports each install in its inventory's
`provision`, stored as `EngineInstall` rows.
"""

from __future__ import annotations

from collections import defaultdict
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


# The states that stop placement on a node until the agent reports the engine ready.
BLOCKING = (EngineInstall.State.FAILED, EngineInstall.State.UNSUPPORTED)
# A reason quotes only the last line of a log tail, and not all of a long one.
_REASON_CHARS = 160


def blocked_installs(node_ids: Iterable[str] | None = None) -> dict[str, dict[tuple[str, str], str]]:
    """Per node, the (engine, variant) installs that stop placement there, each with why, in one query.

    An install is blocked when it failed or cannot run there (`unsupported`), unless another
    version of the same engine and variant is ready. An install never reported, or under way,
    blocks nothing: placing a shard there is how the install is asked for.
    """
    rows = EngineInstall.objects.exclude(state=EngineInstall.State.INSTALLING)
    if node_ids is not None:
        rows = rows.filter(node_id__in=list(node_ids))
    ready, bad = set(), {}
    for node_id, engine, kind, state, detail in rows.values_list("node_id", "engine", "variant", "state", "detail"):
        if state == EngineInstall.State.READY:
            ready.add((node_id, engine, kind))
        else:
            bad[(node_id, engine, kind)] = why(state, detail)
    found: dict[str, dict[tuple[str, str], str]] = defaultdict(dict)
    for (node_id, engine, kind), reason in sorted(bad.items()):
        if (node_id, engine, kind) not in ready:
            found[node_id][(engine, kind)] = reason
    return dict(found)


def why(state: str, detail: str) -> str:
    """An install's state and the last line of its detail, short enough for a one-line reason."""
    lines = [line.strip() for line in detail.splitlines() if line.strip()]
    last = lines[-1] if lines else ""
    if len(last) > _REASON_CHARS:
        last = last[: _REASON_CHARS - 1] + "…"
    return f"{state}: {last}" if last else state
