"""Questions about many nodes, asked of the database: shared by the admin and the pages.

Each filter here mirrors a rule decided elsewhere (the displayed state mirrors
`derive_state`, the labels mirror `Node.all_labels`), so that a list filtered
in the database shows the same nodes as one filtered row by row.
"""

from __future__ import annotations

from django.db.models import Exists, OuterRef, Q
from django.db.models.fields.json import KeyTextTransform
from django.db.models.lookups import Exact

from inventory.models import GPU, AdminState, Liveness, NodeState

# The displayed state as a database filter, mirroring derive_state.
STATE_FILTERS = {
    NodeState.LOST: Q(liveness=Liveness.LOST),
    NodeState.UNREACHABLE: Q(liveness=Liveness.UNREACHABLE),
    NodeState.DRAINING: Q(liveness=Liveness.ALIVE, admin_state=AdminState.DRAINING),
    NodeState.CORDONED: Q(liveness=Liveness.ALIVE, admin_state=AdminState.CORDONED),
    NodeState.READY: Q(liveness=Liveness.ALIVE, admin_state=AdminState.ACTIVE),
}


def label_filter(key: str, value: str) -> Q:
    """Nodes whose label `key` is `value`, an operator's label winning over the agent's.

    The key is used as a literal JSON key (never parsed as a lookup path), so a
    key from a URL cannot reach another field or lookup.
    """
    operator_has_key = Q(operator_labels__has_key=key)
    from_operator = operator_has_key & Q(Exact(KeyTextTransform(key, "operator_labels"), value))
    from_agent = ~operator_has_key & Q(Exact(KeyTextTransform(key, "labels"), value))
    return from_operator | from_agent


def gpu_class_filter(gpu_class: str) -> Q:
    """Nodes with at least one GPU of this class, without joining (so no duplicates)."""
    return Q(Exists(GPU.objects.filter(node=OuterRef("pk"), gpu_class=gpu_class)))
