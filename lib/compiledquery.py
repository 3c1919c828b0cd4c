"""A queryset compiled to SQL once per process, then run with another value for its one parameter.

Django compiles a queryset afresh every time it is evaluated: for a query with
`select_related` across two joins that cost several times running it
(`python -m bench.fleetlib.profile --cold`, `inventory/desired.py`). A
`CompiledQuery` builds the queryset once with a stand-in value, keeps its SQL,
its converters and how its rows become model instances, and afterwards only
substitutes the value, executes and builds the instances as the ORM would
(`django.db.models.query.ModelIterable`, which this follows).

Only what `ModelIterable` supports without the queryset itself is supported:
model instances with their `select_related` objects; no annotations, no
`prefetch_related`, no known related objects (raises ValueError when built).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.db import connections
from django.db.models import Model, QuerySet
from django.db.models.query import ModelIterable, get_related_populators

# Stands for the value in the built queryset; found again among the compiled parameters.
_STAND_IN = "\x00llmgw-compiled-query-parameter\x00"


class CompiledQuery:
    def __init__(self, build: Callable[[Any], QuerySet]):
        """`build(value)` returns the queryset for `value`; it is called once, with a stand-in."""
        self._build = build
        self._compiled: _Compiled | None = None

    def run(self, value: Any) -> list[Model]:
        """The queryset's instances for `value`, as `list(build(value))` would return them."""
        if self._compiled is None:
            # The SQL depends on the database's vendor only, which a process never changes.
            self._compiled = _Compiled(self._build(_STAND_IN))
        return self._compiled.run(value)


class _Compiled:
    def __init__(self, queryset: QuerySet):
        if (
            queryset._iterable_class is not ModelIterable
            or queryset._prefetch_related_lookups
            or queryset._known_related_objects
            or queryset.query.annotation_select
        ):
            raise ValueError("only a plain model queryset, with select_related at most, can be compiled")
        self.alias = queryset.db
        compiler = queryset.query.get_compiler(using=self.alias)
        self.sql, params = compiler.as_sql()
        places = [index for index, param in enumerate(params) if param == _STAND_IN]
        if len(places) != 1:
            raise ValueError(f"the stand-in value appears {len(places)} times among the parameters, not once")
        self.params, self.place = list(params), places[0]
        select, klass_info = compiler.select, compiler.klass_info
        self.converters = list(compiler.get_converters([column[0] for column in select[: compiler.col_count]]).items())
        self.model = klass_info["model"]
        fields = klass_info["select_fields"]
        self.start, self.end = fields[0], fields[-1] + 1
        self.init_list = [column[0].target.attname for column in select[self.start : self.end]]
        self.populators = get_related_populators(klass_info, select, self.alias)

    def run(self, value: Any) -> list[Model]:
        params = self.params.copy()
        params[self.place] = value
        connection = connections[self.alias]
        with connection.cursor() as cursor:
            cursor.execute(self.sql, params)
            rows = cursor.fetchall()
        instances = []
        for raw in rows:
            row = list(raw)
            for position, (functions, expression) in self.converters:
                converted = row[position]
                for function in functions:
                    converted = function(converted, expression, connection)
                row[position] = converted
            instance = self.model.from_db(self.alias, self.init_list, row[self.start : self.end])
            for populator in self.populators:
                populator.populate(row, instance)
            instances.append(instance)
        return instances
