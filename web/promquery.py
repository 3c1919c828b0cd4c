"""An hour of a node's history from Prometheus, for the node page's charts.

The server asks Prometheus (`query_range`) and hands the browser ready series;
the browser never talks to Prometheus. Every query has a 2 s budget, and all of
a page's queries run side by side, so a slow or dead Prometheus costs the page
about 2 s at worst and turns into a sentence on the page, never an error page.
"""

from __future__ import annotations

import math
import time
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FuturesTimeout
from dataclasses import dataclass, field

import requests
from django.conf import settings

TIMEOUT = 2.0
SPAN = 3600
STEP = 15


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
        ChartSpec("gpu_utilization", "GPU busy", "percent", _per_gpu("llmgw_gpu_utilization_percent", node), "name"),
        ChartSpec("gpu_memory", "GPU memory used", "bytes", _per_gpu("llmgw_gpu_memory_used_bytes", node), "name"),
    ]


def _per_gpu(metric: str, node: str) -> str:
    """One series per GPU, named "GPU <index>" (a card swapped at an index continues its line)."""
    return f'label_replace(max by (gpu) ({metric}{{{node}}}), "name", "GPU $1", "gpu", "(.*)")'


def query_range(
    query: str, start: float, end: float, step: float, base_url: str | None = None, timeout: float = TIMEOUT
) -> list[dict]:
    """The `result` of one range query (a list of {metric, values}); raises PrometheusUnavailable."""
    base = (base_url or settings.PROMETHEUS_URL).rstrip("/")
    try:
        response = requests.get(
            f"{base}/api/v1/query_range",
            params={"query": query, "start": start, "end": end, "step": step},
            timeout=timeout,
        )
    except requests.Timeout:
        raise PrometheusUnavailable(f"Prometheus at {base} did not answer within {timeout:g} s") from None
    except requests.ConnectionError:
        raise PrometheusUnavailable(f"Prometheus at {base} is not reachable") from None
    except requests.RequestException as exc:
        raise PrometheusUnavailable(f"Prometheus at {base} failed: {exc.__class__.__name__}") from None
    try:
        body = response.json()
    except ValueError:
        raise PrometheusUnavailable(
            f"Prometheus at {base} answered HTTP {response.status_code} without its API's JSON"
        ) from None
    if not isinstance(body, dict) or body.get("status") != "success":
        error = body.get("error", "unknown error") if isinstance(body, dict) else "unknown error"
        raise PrometheusUnavailable(f"Prometheus refused the query (HTTP {response.status_code}): {error}")
    result = body.get("data", {}).get("result", [])
    return result if isinstance(result, list) else []


def grid(now: float, span: int = SPAN, step: int = STEP) -> list[float]:
    """The shared time axis, ending now: every query asks for the same start and step, so
    their points land on it. Ending at now rather than at the last round step keeps the
    newest samples on the chart."""
    end = math.floor(now)
    return [float(end - span + i * step) for i in range(span // step + 1)]


def align(result: list[dict], times: list[float], spec: ChartSpec) -> tuple[list[str], list[list[float | None]]]:
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


def node_history(node_id: str, now: float | None = None, base_url: str | None = None) -> History:
    """An hour of the node's charts; raises PrometheusUnavailable with the reason."""
    times = grid(now if now is not None else time.time())
    specs = node_charts(node_id)
    pool = ThreadPoolExecutor(max_workers=len(specs), thread_name_prefix="promquery")
    futures = [pool.submit(query_range, s.query, times[0], times[-1], STEP, base_url) for s in specs]
    deadline = time.monotonic() + TIMEOUT + 0.5
    try:
        # A server that trickles bytes can outlast the per-read timeout, so the
        # page also keeps a deadline of its own and leaves such a query behind.
        results = [f.result(timeout=max(deadline - time.monotonic(), 0)) for f in futures]
    except FuturesTimeout:
        raise PrometheusUnavailable(f"Prometheus did not answer within {TIMEOUT:g} s") from None
    finally:
        pool.shutdown(wait=False, cancel_futures=True)
    charts = []
    for spec, result in zip(specs, results, strict=True):
        series, values = align(result, times, spec)
        charts.append(Chart(spec.key, spec.title, spec.unit, series, values))
    return History(times=times, charts=charts)
