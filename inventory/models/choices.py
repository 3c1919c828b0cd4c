"""The states a node can be in, and the one colour map every page uses."""

from django.db import models


class AdminState(models.TextChoices):
    """Operator intent. Only an operator changes it (or drain finishing)."""

    ACTIVE = "active", "active"
    CORDONED = "cordoned", "cordoned"
    DRAINING = "draining", "draining"


class Liveness(models.TextChoices):
    """What heartbeats say. Only heartbeats and the stale-marking task change it."""

    ALIVE = "alive", "alive"
    UNREACHABLE = "unreachable", "unreachable"
    LOST = "lost", "lost"


class NodeState(models.TextChoices):
    """The displayed state, derived from the two above by `derive_state`."""

    READY = "ready", "ready"
    CORDONED = "cordoned", "cordoned"
    DRAINING = "draining", "draining"
    UNREACHABLE = "unreachable", "unreachable"
    LOST = "lost", "lost"


# One colour per displayed state, for badges in the admin and on the pages.
STATE_COLOURS = {
    NodeState.READY: "green",
    NodeState.CORDONED: "amber",
    NodeState.DRAINING: "blue",
    NodeState.UNREACHABLE: "orange",
    NodeState.LOST: "red",
}


def derive_state(admin_state: str, liveness: str) -> NodeState:
    """The single place that decides what state a node is shown in.

    Liveness wins: a cordoned node that stopped answering is shown unreachable,
    and once it answers again it is shown cordoned, because the cordon was never
    touched.
    """
    if liveness == Liveness.LOST:
        return NodeState.LOST
    if liveness == Liveness.UNREACHABLE:
        return NodeState.UNREACHABLE
    if admin_state == AdminState.DRAINING:
        return NodeState.DRAINING
    if admin_state == AdminState.CORDONED:
        return NodeState.CORDONED
    return NodeState.READY
