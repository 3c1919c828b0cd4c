"""The alerts firing now, from Prometheus' `/api/v1/alerts`, for the cluster and node pages.

One call answers for the whole fleet (alerts carry the `node` label, see
`deploy/rules/`), with the charts' deadline and shape checks. Each process keeps
the answer, or the reason there is none, and asks again behind the pages
(nodes/promcache.py): the cluster table refreshes every 5 s on every open page,
and a Prometheus that is slow or hangs should cost no render its wait.
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime

from django.conf import settings

from nodes import promquery, promshape
from nodes.promcache import AnswerCache

# Shorter than the charts' deadline: this call sits in the cluster page's own render.
TIMEOUT = 1.0


@dataclass(frozen=True)
class Alert:
    name: str
    severity: str
    summary: str
    node: str
    since: datetime | None


@dataclass
class Firing:
    """What fires now, or why that is unknown (`problem`): never "none" when unknown."""

    alerts: list[Alert] = field(default_factory=list)
    problem: str | None = None

    def for_node(self, node_id: str) -> list[Alert]:
        return [alert for alert in self.alerts if alert.node == node_id]

    def per_node(self) -> Counter[str]:
        return Counter(alert.node for alert in self.alerts if alert.node)

    @property
    def nodes(self) -> int:
        return len(self.per_node())


def _since(active_at: str) -> datetime | None:
    try:
        return datetime.fromisoformat(active_at) if active_at else None
    except ValueError:
        return None


def fetch(base_url: str | None = None) -> Firing:
    """Ask Prometheus now; a failure becomes `problem`, in words for the page."""
    deadline = time.monotonic() + TIMEOUT
    try:
        base, body = promquery.api_get("/api/v1/alerts", base_url, deadline, TIMEOUT)
        try:
            listed = promshape.alerts(body)
        except promshape.WrongShape as exc:
            raise promquery.PrometheusUnavailable(
                f"Prometheus at {base} answered in an unexpected shape: {exc}"
            ) from None
    except promquery.PrometheusUnavailable as exc:
        return Firing(problem=str(exc))
    alerts = [
        Alert(
            name=a["labels"].get("alertname", ""),
            severity=a["labels"].get("severity", ""),
            summary=a["annotations"].get("summary", ""),
            node=a["labels"].get("node", ""),
            since=_since(a["active_at"]),
        )
        for a in listed
        # Pending alerts have not waited their `for:` yet: they are not firing.
        if a["state"] == "firing"
    ]
    alerts.sort(key=lambda a: (a.node, a.since.timestamp() if a.since else 0.0, a.name))
    return Firing(alerts=alerts)


cache: AnswerCache[Firing] = AnswerCache()


def firing() -> Firing:
    """What fires now, as last asked (nodes/promcache.py)."""
    base = settings.PROMETHEUS_URL
    return cache.get(base, lambda: fetch(base))
