"""The states a node can be in, and the one colour map every page uses."""

from typing import TYPE_CHECKING, ClassVar

from django.db import models

if TYPE_CHECKING:
    from enum import StrEnum

    class TextChoices(StrEnum):
        """What mypy is told of Django's TextChoices (Django ships no types): a str enum with its lists.

        Every TextChoices of the inventory derives from this name, so mypy checks their members as enums.
        """

        values: ClassVar[list[str]]
        choices: ClassVar[list[tuple[str, str]]]

else:
    TextChoices = models.TextChoices


class ValueChoices(TextChoices):
    """Choices shown as they are stored ("cordoned"), where Django would title-case the name ("Cordoned")."""

    @property
    def label(self) -> str:
        return self.value


class AdminState(ValueChoices):
    """Operator intent. Only an operator changes it (or drain finishing)."""

    ACTIVE = "active"
    CORDONED = "cordoned"
    DRAINING = "draining"


class Liveness(ValueChoices):
    """What heartbeats say. Only heartbeats and the stale-marking task change it."""

    ALIVE = "alive"
    UNREACHABLE = "unreachable"
    LOST = "lost"


class NodeState(ValueChoices):
    """The displayed state, derived from the two above by `derive_state`."""

    READY = "ready"
    CORDONED = "cordoned"
    DRAINING = "draining"
    UNREACHABLE = "unreachable"
    LOST = "lost"


# One colour per displayed state, for badges in the admin and on the pages.
STATE_COLOURS = {
    NodeState.READY: "green",
    NodeState.CORDONED: "amber",
    NodeState.DRAINING: "blue",
    NodeState.UNREACHABLE: "orange",
    NodeState.LOST: "red",
}


# The one encoding of the displayed state: each state with the stored fields
# that make it, worst first. The first match wins, so liveness decides before
# admin state: a cordoned node that stopped answering is shown unreachable,
# and once it answers again it is shown cordoned, because the cordon was never
# touched. `derive_state` (one node in Python) and `state_q` (many nodes in the
# database) are both read off this table, so they cannot disagree.
STATE_RULES: tuple[tuple[NodeState, dict[str, str]], ...] = (
    (NodeState.LOST, {"liveness": Liveness.LOST}),
    (NodeState.UNREACHABLE, {"liveness": Liveness.UNREACHABLE}),
    (NodeState.DRAINING, {"liveness": Liveness.ALIVE, "admin_state": AdminState.DRAINING}),
    (NodeState.CORDONED, {"liveness": Liveness.ALIVE, "admin_state": AdminState.CORDONED}),
    (NodeState.READY, {"liveness": Liveness.ALIVE, "admin_state": AdminState.ACTIVE}),
)


def _first_match(admin_state: str, liveness: str) -> NodeState:
    stored = {"admin_state": admin_state, "liveness": liveness}
    for state, fields in STATE_RULES:
        if all(stored[name] == value for name, value in fields.items()):
            return state
    return NodeState.READY


# Every pair worked out once: derive_state runs per node in placement and
# /metrics, 10,000 times a pass, so it is one dict lookup.
_STATE_OF: dict[tuple[str, str], NodeState] = {
    (admin, live): _first_match(admin, live) for admin in AdminState for live in Liveness
}


def derive_state(admin_state: str, liveness: str) -> NodeState:
    """The state a node is shown in, by STATE_RULES."""
    return _STATE_OF.get((admin_state, liveness)) or _first_match(admin_state, liveness)


def state_q(state: NodeState | str) -> models.Q:
    """The nodes shown in `state`, as a database filter (STATE_RULES, as derive_state reads it)."""
    return models.Q(**dict(STATE_RULES)[NodeState(state)])


def state_order() -> models.Case:
    """Worst state first (lost = 0 … ready = 4), for sorting nodes by state in the database."""
    return models.Case(
        *(models.When(models.Q(**fields), then=models.Value(rank)) for rank, (_, fields) in enumerate(STATE_RULES)),
        default=models.Value(len(STATE_RULES)),
        output_field=models.IntegerField(),
    )
