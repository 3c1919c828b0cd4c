"""Questions about many nodes, asked of the database: shared by the admin and the pages.

Each filter here mirrors a rule decided elsewhere (the labels mirror
`Node.all_labels`), so that a list filtered in the database shows the same
nodes as one filtered row by row. The displayed state is
`Node.objects.in_state`.
"""

from __future__ import annotations

from django.db.models import Count, Exists, IntegerField, OuterRef, Q, QuerySet, Subquery
from django.db.models.fields.json import KeyTextTransform
from django.db.models.functions import Coalesce
from django.db.models.lookups import Exact

from inventory.models import GPU


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


def count_per_node(queryset: QuerySet) -> Coalesce:
    """How many rows of `queryset` (of a model with a `node`) each node has, for `annotate`.

    A correlated subquery rather than a join: sorting or paging nodes by it
    needs no GROUP BY over the fleet, and two counts do not multiply each other.
    """
    counted = queryset.filter(node=OuterRef("pk")).order_by().values("node").annotate(n=Count("*")).values("n")
    return Coalesce(Subquery(counted, output_field=IntegerField()), 0)
