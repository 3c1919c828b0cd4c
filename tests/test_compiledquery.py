"""A queryset compiled once (lib/compiledquery.py) returns what the ORM returns, for every value it is run with."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from inventory.models import Shard
from lib.compiledquery import CompiledQuery
from tests.factories import node, place

pytestmark = pytest.mark.django_db


def shards_of(node_id):
    return (
        Shard.objects.filter(node_id=node_id, index__gte=0).select_related("replica__deployment").order_by("shard_id")
    )


def described(shard: Shard) -> tuple:
    """Every field of the shard, its replica and its deployment, converted as the ORM converts them."""
    replica, deployment = shard.replica, shard.replica.deployment
    return tuple(
        (field.attname, getattr(instance, field.attname))
        for instance in (shard, replica, deployment)
        for field in instance._meta.concrete_fields
    )


def test_it_returns_the_orms_instances_with_their_related_objects_for_each_value():
    node("a", gpus=8)
    node("b", gpus=8)
    place("wide", {"a": [0, 1], "b": [2, 3]}, fabric="")
    place("narrow", {"a": [4]})
    compiled = CompiledQuery(shards_of)

    for node_id in ("a", "b", "nobody"):
        expected = list(shards_of(node_id))
        with CaptureQueriesContext(connection) as queries:
            found = compiled.run(node_id)
            # The related objects came with the row: reading them asks nothing more.
            [shard.replica.deployment.name for shard in found]
        assert len(queries) == 1
        assert [described(s) for s in found] == [described(s) for s in expected]
    # Converted from the database's types, as the ORM converts them: JSON to lists, times to aware datetimes.
    first = compiled.run("b")[0]
    assert first.gpu_indices == [2, 3]
    assert first.changed_at.tzinfo is not None


def test_a_queryset_it_cannot_build_instances_for_is_refused():
    with pytest.raises(ValueError):
        CompiledQuery(lambda node_id: Shard.objects.filter(node_id=node_id).values_list("shard_id")).run("a")
