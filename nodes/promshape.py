"""The shape of a Prometheus answer (a range query's matrix, the alerts list), checked before anything reads it.

A proxy, an old or a broken Prometheus can answer `"status": "success"` with
`"data": null`, a list for an object, or a timestamp of "nan"; each of these
becomes WrongShape naming the place, so the page can say what went wrong.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import TypedDict, TypeVar

T = TypeVar("T")


class Series(TypedDict):
    metric: dict[str, str]
    values: list[tuple[float, float]]


class WrongShape(Exception):
    """The answer is not a range query's matrix; the message names the place."""


def _kind(value: object) -> str:
    if value is None:
        return "null"
    return {dict: "an object", list: "a list", str: "a string", bool: "a boolean"}.get(type(value), "a number")


def _expect(value: object, kind: type[T], where: str) -> T:
    """`value`, if it is a `kind` (dict or list); raises WrongShape."""
    if not isinstance(value, kind) or isinstance(value, bool):
        wanted = "an object" if kind is dict else "a list"
        raise WrongShape(f"{where} is {_kind(value)}, not {wanted}")
    return value


def _data(body: dict) -> dict:
    return _expect(body.get("data"), dict, "data")


def _objects(data: dict, name: str) -> Iterator[tuple[str, dict]]:
    """Each object of the list `data.<name>`, with the place it stands at; raises WrongShape."""
    listed = _expect(data.get(name), list, f"data.{name}")
    for i, item in enumerate(listed):
        where = f"data.{name}[{i}]"
        yield where, _expect(item, dict, where)


def _point(point: object, where: str) -> tuple[float, float]:
    if not isinstance(point, list) or len(point) != 2:
        raise WrongShape(f"{where} is not a [time, value] pair")
    t, raw = point
    if isinstance(t, bool) or not isinstance(t, int | float) or not math.isfinite(t):
        raise WrongShape(f"{where}[0] is {t!r}, not a time")
    if not isinstance(raw, str):
        raise WrongShape(f"{where}[1] is {_kind(raw)}, not a value in a string")
    try:
        # Prometheus writes NaN and ±Inf as strings: they are values, shown as gaps later.
        value = float(raw)
    except ValueError:
        raise WrongShape(f"{where}[1] is {raw[:20]!r}, not a number") from None
    return float(t), value


def matrix(body: dict) -> list[Series]:
    """The series of a successful range query's answer; raises WrongShape."""
    data = _data(body)
    if data.get("resultType") != "matrix":
        raise WrongShape(f"data.resultType is {data.get('resultType')!r}, not 'matrix'")
    checked = []
    for where, series in _objects(data, "result"):
        metric = _strings(series.get("metric"), f"{where}.metric")
        values = _expect(series.get("values"), list, f"{where}.values")
        points = [_point(point, f"{where}.values[{j}]") for j, point in enumerate(values)]
        checked.append(Series(metric=metric, values=points))
    return checked


class AlertShape(TypedDict):
    labels: dict[str, str]
    annotations: dict[str, str]
    state: str
    # RFC 3339 as Prometheus writes it; "" when the answer has none.
    active_at: str


def _strings(value: object, where: str) -> dict[str, str]:
    checked = _expect(value, dict, where)
    if not all(isinstance(v, str) for v in checked.values()):
        raise WrongShape(f"{where} has a value that is not a string")
    return checked


def alerts(body: dict) -> list[AlertShape]:
    """The alerts of a successful `/api/v1/alerts` answer; raises WrongShape."""
    checked = []
    for where, alert in _objects(_data(body), "alerts"):
        state = alert.get("state")
        if not isinstance(state, str):
            raise WrongShape(f"{where}.state is {_kind(state)}, not a string")
        active_at = alert.get("activeAt", "")
        if not isinstance(active_at, str):
            raise WrongShape(f"{where}.activeAt is {_kind(active_at)}, not a string")
        checked.append(
            AlertShape(
                labels=_strings(alert.get("labels"), f"{where}.labels"),
                annotations=_strings(alert.get("annotations", {}), f"{where}.annotations"),
                state=state,
                active_at=active_at,
            )
        )
    return checked


class Sample(TypedDict):
    metric: dict[str, str]
    value: float


def vector(body: dict) -> list[Sample]:
    """The samples of a successful instant query's answer; raises WrongShape."""
    data = _data(body)
    if data.get("resultType") != "vector":
        raise WrongShape(f"data.resultType is {data.get('resultType')!r}, not 'vector'")
    checked = []
    for where, sample in _objects(data, "result"):
        metric = _strings(sample.get("metric"), f"{where}.metric")
        _, value = _point(sample.get("value"), f"{where}.value")
        checked.append(Sample(metric=metric, value=value))
    return checked
