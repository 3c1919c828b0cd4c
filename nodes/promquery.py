"""A node's history from Prometheus over a chosen range, for the node page's charts.

The server asks Prometheus (`query_range`) and hands the browser ready series;
the browser never talks to Prometheus. A page's queries share one 2 s deadline,
so a slow, dead or trickling Prometheus costs the page 2 s at worst, and it, or an
answer of the wrong shape, turns into a sentence on the page, never an error page.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass, field
from urllib.parse import urlencode

from django.conf import settings

from nodes import promhttp, promshape

TIMEOUT = 2.0
SPAN = 3600
STEP = 15
# A chart never asks for more points per series than this: a week at 15 s would be
# 40,000 points per series, more than a chart can show and Prometheus' 11,000 limit.
MAX_POINTS = 1000
# Steps a range may use, smallest first; each divides a minute or an hour evenly, so
# the grid's points fall on round times.
STEPS = (15, 30, 60, 120, 300, 600, 900, 1800, 3600)


def step_for(span: int) -> int:
    """The smallest step that keeps `span` within MAX_POINTS points per series."""
    return next(step for step in STEPS if span // step + 1 <= MAX_POINTS)


@dataclass(frozen=True)
class TimeRange:
    """One of the ranges the node page offers; `key` is what the URL carries (`?range=6h`)."""

    key: str
    label: str
    span: int

    @property
    def step(self) -> int:
        return step_for(self.span)


RANGES = {
    r.key: r
    for r in (
        TimeRange("1h", "1 h", 3600),
        TimeRange("6h", "6 h", 6 * 3600),
        TimeRange("24h", "24 h", 24 * 3600),
        TimeRange("7d", "7 d", 7 * 86400),
    )
}
DEFAULT_RANGE = RANGES["1h"]


class PrometheusUnavailable(Exception):
    """Prometheus could not answer; the message says why, in words for the page."""


@dataclass(frozen=True)
class ChartSpec:
    """One chart: a PromQL query and the label that names each of its series."""

    key: str
    title: str
    unit: str
    query: str
    series_label: str | None = None
    # The name of the only series when series_label is None.
    series_name: str = ""


@dataclass
class Chart:
    key: str
    title: str
    unit: str
    series: list[str] = field(default_factory=list)
    values: list[list[float | None]] = field(default_factory=list)

    @property
    def has_data(self) -> bool:
        return any(v is not None for column in self.values for v in column)


@dataclass
class History:
    """Aligned series for the charts: one shared time axis, one list per series."""

    times: list[float]
    charts: list[Chart]

    def as_json(self) -> dict:
        return {
            "times": self.times,
            "charts": [
                {"key": c.key, "title": c.title, "unit": c.unit, "series": c.series, "values": c.values}
                for c in self.charts
            ],
        }


def promql_string(value: str) -> str:
    """A PromQL double-quoted string literal."""
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def node_charts(node_id: str) -> list[ChartSpec]:
    """The node page's charts, on the metric names the control plane exports (docs/design.md, "Fixed points")."""
    node = f"node={promql_string(node_id)}"
    return [
        ChartSpec("cpu", "CPU", "percent", f"llmgw_node_cpu_utilization_percent{{{node}}}", series_name="CPU %"),
        ChartSpec(
            "memory",
            "RAM",
            "bytes",
            f'{{__name__=~"llmgw_node_memory_(used|available)_bytes",{node}}}',
            series_label="__name__",
        ),
        ChartSpec("load", "Load", "load", f"llmgw_node_load{{{node}}}", series_label="window"),
        ChartSpec(
            "cores", "CPU cores per model", "cores", f"sum by (model) (llmgw_shard_cpu_cores{{{node}}})", "model"
        ),
        ChartSpec(
            "shard_memory",
            "Memory per model",
            "bytes",
            f"sum by (model) (llmgw_shard_memory_bytes{{{node}}})",
            "model",
        ),
        ChartSpec(
            "queue", "Queue depth per model", "count", f"sum by (model) (llmgw:shard_queue_depth{{{node}}})", "model"
        ),
        ChartSpec(
            "running",
            "Running requests per model",
            "count",
            f"sum by (model) (llmgw:shard_requests_running{{{node}}})",
            "model",
        ),
        ChartSpec(
            "tokens",
            "Tokens/s per model",
            "tokens/s",
            f"sum by (model) (llmgw:shard_tokens_per_second{{{node}}})",
            "model",
        ),
        ChartSpec("gpu_utilization", "GPU busy", "percent", _per_gpu("llmgw_gpu_utilization_percent", node), "name"),
        ChartSpec("gpu_memory", "GPU memory used", "bytes", _per_gpu("llmgw_gpu_memory_used_bytes", node), "name"),
    ]


def _per_gpu(metric: str, node: str) -> str:
    """One series per GPU, named "GPU <index>" (a card swapped at an index continues its line)."""
    return f'label_replace(max by (gpu) ({metric}{{{node}}}), "name", "GPU $1", "gpu", "(.*)")'


def api_get(path: str, base_url: str | None, deadline: float, timeout: float = TIMEOUT) -> tuple[str, dict]:
    """GET one of Prometheus' API paths by `deadline`; returns its base URL and the successful answer.

    Raises PrometheusUnavailable, saying why, when Prometheus cannot be reached,
    refuses, answers something that is not its API, or has not finished by
    `deadline` (a `time.monotonic()` value, `timeout` seconds after the caller began).
    """
    base = (base_url or settings.PROMETHEUS_URL).rstrip("/")
    try:
        status, raw = promhttp.get(f"{base}{path}", deadline)
    except promhttp.DeadlinePassed:
        raise PrometheusUnavailable(f"Prometheus at {base} did not answer within {timeout:g} s") from None
    except promhttp.NotHTTP:
        raise PrometheusUnavailable(f"Prometheus at {base} answered something that is not HTTP") from None
    except promhttp.TooLarge:
        raise PrometheusUnavailable(f"Prometheus at {base} answered more than {promhttp.MAX_BYTES} bytes") from None
    except OSError:
        raise PrometheusUnavailable(f"Prometheus at {base} is not reachable") from None
    try:
        body = json.loads(raw)
    except ValueError:
        raise PrometheusUnavailable(f"Prometheus at {base} answered HTTP {status} without its API's JSON") from None
    if not isinstance(body, dict) or body.get("status") != "success":
        error = body.get("error", "unknown error") if isinstance(body, dict) else "unknown error"
        raise PrometheusUnavailable(f"Prometheus refused the query (HTTP {status}): {error}")
    return base, body


def query_range(
    query: str, start: float, end: float, step: float, base_url: str | None = None, deadline: float | None = None
) -> list[promshape.Series]:
    """The `result` of one range query (a list of {metric, values}), checked for shape.

    Raises PrometheusUnavailable as `api_get` does, or when the answer is of another
    shape; `deadline` is TIMEOUT from now when not given.
    """
    deadline = deadline if deadline is not None else time.monotonic() + TIMEOUT
    params = urlencode({"query": query, "start": start, "end": end, "step": step})
    base, body = api_get(f"/api/v1/query_range?{params}", base_url, deadline)
    try:
        return promshape.matrix(body)
    except promshape.WrongShape as exc:
        raise PrometheusUnavailable(f"Prometheus at {base} answered in an unexpected shape: {exc}") from None


def query(
    expr: str, base_url: str | None = None, deadline: float | None = None, timeout: float = TIMEOUT
) -> list[promshape.Sample]:
    """The `result` of one instant query (a list of {metric, value}), checked for shape.

    Raises PrometheusUnavailable as `api_get` does, or when the answer is of another
    shape; `deadline` is `timeout` from now when not given.
    """
    deadline = deadline if deadline is not None else time.monotonic() + timeout
    base, body = api_get(f"/api/v1/query?{urlencode({'query': expr})}", base_url, deadline, timeout)
    try:
        return promshape.vector(body)
    except promshape.WrongShape as exc:
        raise PrometheusUnavailable(f"Prometheus at {base} answered in an unexpected shape: {exc}") from None


def grid(now: float, span: int = SPAN, step: int = STEP) -> list[float]:
    """The shared time axis, ending now: every query asks for the same start and step, so
    their points land on it. Ending at now rather than at the last round step keeps the
    newest samples on the chart."""
    end = math.floor(now)
    return [float(end - span + i * step) for i in range(span // step + 1)]


def align(
    result: list[promshape.Series], times: list[float], spec: ChartSpec
) -> tuple[list[str], list[list[float | None]]]:
    """Put each series of a range result on the shared axis, None where it has no point."""
    start, step = times[0], (times[1] - times[0]) if len(times) > 1 else 1.0
    named = []
    for series in result:
        metric = series.get("metric", {})
        name = metric.get(spec.series_label, "") if spec.series_label else spec.series_name
        if spec.series_label == "__name__":
            name = name.removeprefix("llmgw_node_memory_").removesuffix("_bytes")
        column: list[float | None] = [None] * len(times)
        for t, raw in series.get("values", []):
            slot = round((float(t) - start) / step)
            if 0 <= slot < len(times):
                value = float(raw)
                column[slot] = value if math.isfinite(value) else None
        named.append((name or "—", column))
    named.sort(key=lambda pair: pair[0])
    return [name for name, _ in named], [column for _, column in named]


def node_history(
    node_id: str, now: float | None = None, base_url: str | None = None, time_range: TimeRange = DEFAULT_RANGE
) -> History:
    """The node's charts over `time_range`; raises PrometheusUnavailable with the reason."""
    return history(node_charts(node_id), now, base_url, time_range)


def history(
    specs: list[ChartSpec], now: float | None = None, base_url: str | None = None, time_range: TimeRange = DEFAULT_RANGE
) -> History:
    """Charts over `time_range` (a node's, a model's); raises PrometheusUnavailable with the reason.

    The queries share one deadline: each is a few milliseconds from a healthy
    Prometheus, and one after another they need no threads, so a Prometheus that
    hangs or trickles costs the request TIMEOUT at most and leaves nothing running.
    """
    step = time_range.step
    times = grid(now if now is not None else time.time(), time_range.span, step)
    deadline = time.monotonic() + TIMEOUT
    charts = []
    for spec in specs:
        result = query_range(spec.query, times[0], times[-1], step, base_url, deadline)
        series, values = align(result, times, spec)
        charts.append(Chart(spec.key, spec.title, spec.unit, series, values))
    return History(times=times, charts=charts)
