"""Whether each running shard's engine metrics reach Prometheus, and each node's requests waiting.

The node page says "no engine metrics" and why for a running shard without
`llmgw:shard_*` series, rather than letting a chart show nothing or a table show
0; the cluster page shows requests waiting per node. Each is one instant query
(the node's, or one for the whole fleet), under the charts' deadline and shape
checks, and each process keeps its answer, or the reason there is none, and
asks again behind the pages (nodes/promcache.py), as for the alerts.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime

from django.conf import settings

from agent.enginekinds import Signal
from agent.enginekinds.rules import names
from nodes import promquery
from nodes.promcache import AnswerCache

# Shorter than the charts' deadline: these calls sit in the pages' own render.
TIMEOUT = 1.0
# A shard without a sample this recent has no engine metrics (the alert waits as long).
FRESH = 300
# How far back the node page looks for a shard's last engine sample, to say since when it has none.
LOOKBACK = "1h"


def last_seen_query(node_id: str) -> str:
    """Each of the node's shards' newest engine sample time over LOOKBACK.

    `timestamp` drops the metric name, so each signal is its own term joined by
    `or` (one selector over all names would give clashing series). The first part
    is exact for a shard with a sample within Prometheus' 5-minute lookback; the
    subquery, at a 1 m step aligned to the minute, finds older ones but misses a
    series younger than its last step, which the first part covers.
    """
    node = f"node={promquery.promql_string(node_id)}"
    stamps = " or ".join(f"timestamp({signal.value}{{{node}}})" for signal in Signal)
    return f"max by (shard) ({stamps}) or max by (shard) (max_over_time(({stamps})[{LOOKBACK}:1m]))"


WAITING_QUERY = f"sum by (node) ({Signal.REQUESTS_WAITING.value})"


@dataclass
class Answer:
    """A value per label (a shard's last sample time, a node's requests waiting), or why there is none."""

    values: dict[str, float] = field(default_factory=dict)
    problem: str | None = None


def fetch(expr: str, label: str, base_url: str | None = None) -> Answer:
    """Ask Prometheus now; a failure becomes `problem`, in words for the page."""
    try:
        samples = promquery.query(expr, base_url, timeout=TIMEOUT)
    except promquery.PrometheusUnavailable as exc:
        return Answer(problem=str(exc))
    return Answer(values={s["metric"].get(label, ""): s["value"] for s in samples})


cache: AnswerCache[Answer] = AnswerCache()


def last_seen(node_id: str) -> Answer:
    """Each of the node's shards' newest engine sample time (epoch seconds), as last asked (nodes/promcache.py)."""
    base = settings.PROMETHEUS_URL
    return cache.get((base, "node", node_id), lambda: fetch(last_seen_query(node_id), "shard", base))


def waiting_per_node() -> Answer:
    """Requests waiting per node, summed over its shards, as last asked (nodes/promcache.py)."""
    base = settings.PROMETHEUS_URL
    return cache.get((base, "waiting"), lambda: fetch(WAITING_QUERY, "node", base))


def _clock(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def missing_reason(shard: str, engine: str, seen: Answer, now: float) -> str | None:
    """Why a running shard has no engine metrics, or None when it has some.

    An engine the metric table does not know exports nothing llmgw reads, whatever
    Prometheus holds; otherwise Prometheus is asked, and when it cannot answer the
    page says so rather than guessing either way.
    """
    if not names(engine):
        return f"llmgw knows no metrics of the {engine or 'unnamed'} engine"
    if seen.problem:
        return f"Prometheus unavailable: {seen.problem}"
    last = seen.values.get(shard)
    if last is None:
        return f"Prometheus has no series for this shard in the last {LOOKBACK}"
    if now - last > FRESH:
        return f"Prometheus has no series for this shard since {_clock(last)}"
    return None


def node_reasons(node_id: str, shards: Iterable[tuple[str, str]], now: float) -> dict[str, str]:
    """Why each of the given running (shard, engine) pairs has no engine metrics; only those without."""
    pairs = list(shards)
    if not pairs:
        # Nothing runs: no call to Prometheus.
        return {}
    seen = last_seen(node_id)
    reasons = {shard: missing_reason(shard, engine, seen, now) for shard, engine in pairs}
    return {shard: reason for shard, reason in reasons.items() if reason}
