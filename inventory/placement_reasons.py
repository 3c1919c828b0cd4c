"""Why a replica cannot be placed, in words an operator can act on.

Counts the nodes that have the kind of hardware asked for and says what stops
each group: their state, missing weights, too few free GPUs, too little memory
or too few cores unclaimed, and for a multi-node replica, what each fabric
could hold.
"""

from __future__ import annotations

from collections import Counter

from inventory.fleet import Fleet, NodeView, Profile


def diagnose(fleet: Fleet, profile: Profile) -> str:
    """Why no node, nor any set of nodes on one fabric, can take the replica.

    Counts the nodes that have the kind of hardware asked for and says what
    stops each group, so the operator knows whether to uncordon, free GPUs,
    copy weights or add machines.
    """
    kind = (profile.gpu_class or "GPUs") if profile.gpus else ""
    having = [node for node in fleet.nodes.values() if _has_kind(node, profile)]
    if not having:
        return f"needs {profile.describe()}: " + (f"no node has {kind}" if kind else "there are no nodes")
    problems: Counter = Counter(_why_not(node, profile) for node in having)
    count = len(having)
    parts = [f"{count} {_plural(count, 'node')}" + (f" {_has(count)} {kind}" if kind else "")]
    for problem, n in sorted(problems.items(), key=lambda item: (-item[1], item[0])):
        parts.append(f"{n} " + problem.format(has=_has(n), s="s" if n == 1 else ""))
    text = f"needs {profile.describe()} on one node: " + ", ".join(parts)
    if profile.shards > 1:
        text += "; " + _fabric_summary(fleet, profile)
    return text


def _why_not(node: NodeView, profile: Profile) -> str:
    """A phrase for what stops one node, with {has} and {s} left for the count to fill."""
    if not node.schedulable:
        return node.state.label
    if not node.has_weights(profile.weights_path):
        return f"lack{{s}} {profile.weights_path}"
    blocked = node.engine_block(profile)
    if blocked:
        # The agent's detail is quoted into a format string: its braces must stay text.
        detail = blocked.replace("{", "{{").replace("}", "}}")
        return f"{{has}} {profile.engine} ({profile.variant}) {detail}"
    if profile.gpus and len(node.gpus_of(profile.gpu_class)) < profile.gpus * profile.shards:
        return f"{{has}} {len(node.gpus_of(profile.gpu_class))} free"
    memory = node.memory_free_gb()
    if profile.memory_gb and memory is not None and memory < profile.memory_gb * profile.shards:
        return f"{{has}} {max(memory, 0):.0f} GB memory unclaimed"
    cores = node.cores_free()
    if profile.cpu_cores and cores is not None and cores < profile.cpu_cores * profile.shards:
        return f"{{has}} {max(cores, 0)} cores unclaimed"
    return f"{{has}} room for {node.capacity(profile)} of {profile.shards} shards"


def _fabric_summary(fleet: Fleet, profile: Profile) -> str:
    offered: Counter = Counter()
    islands = 0
    for node in fleet.nodes.values():
        fits = node.capacity(profile)
        if fits and not node.fabrics:
            islands += 1
        for fabric in node.fabrics:
            offered[fabric] += fits
    if offered:
        rooms = ", ".join(f"{fabric} {n}" for fabric, n in sorted(offered.items(), key=lambda i: (-i[1], i[0])))
        text = f"across nodes of one fabric: room for {rooms} of {profile.shards} shards"
    else:
        text = "across nodes: no node with room is on a fabric"
    if islands:
        text += f" ({islands} {_plural(islands, 'node')} with room {_has(islands)} no fabric)"
    return text


def _has_kind(node: NodeView, profile: Profile) -> bool:
    if not profile.gpus:
        return True
    if profile.gpu_class:
        return node.gpu_count[profile.gpu_class] > 0
    return sum(node.gpu_count.values()) > 0


def _plural(count: int, word: str) -> str:
    return word if count == 1 else f"{word}s"


def _has(count: int) -> str:
    return "has" if count == 1 else "have"
