"""Sample lines of the exposition format, written without building sample objects.

Every line here is byte for byte what prometheus_client itself writes for a
gauge sample (labels sorted by name, values escaped the same way, values
formatted by its own `floatToGoString`); tests/test_metrics_lines.py holds the
two side by side. The sample lines of a gauge are the same in the classic text
format and in OpenMetrics, so a line rendered once serves either.
"""

from __future__ import annotations

from functools import lru_cache

from prometheus_client.utils import floatToGoString

# Inventory values repeat across a fleet (the same memory, GPU and disk sizes
# on every machine of a kind), so their formatting is remembered.
value = lru_cache(maxsize=8192)(floatToGoString)


def escape(text: str) -> str:
    """A label value as the exposition format quotes it."""
    return text.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")


def labelset(**labels: str) -> str:
    """`{a="…",b="…"}` with the labels sorted by name, as prometheus_client orders them."""
    return "{" + ",".join(f'{name}="{escape(labels[name])}"' for name in sorted(labels)) + "}"


def line(name: str, labels: str, number: float) -> str:
    """One sample: `labels` is a `labelset()`; no timestamp, so Prometheus' staleness handling applies."""
    return f"{name}{labels} {value(number)}\n"
