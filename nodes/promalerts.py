"""The alerts firing now, from Prometheus' `/api/v1/alerts`, for the cluster and node pages.

One call answers for the whole fleet (alerts carry the `node` label, see
`deploy/rules/`), with the charts' deadline and shape checks. Each process keeps
the answer, or the reason there is none, for MAX_AGE seconds: the cluster table
refreshes every 5 s on every open page, and a Prometheus that hangs should cost a
worker one short wait per MAX_AGE, not one per refresh. Alerts wait a minute or
more before they fire, so a few seconds' delay shows nothing late that matters.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime

from django.conf import settings

from nodes import promquery, promshape

MAX_AGE = 10.0
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


class _Cache:
    """The last answer per Prometheus URL and when it came, shared by the process's threads."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._answers: dict[str, tuple[float, Firing]] = {}

    def get(self, base_url: str) -> Firing:
        now = time.monotonic()
        with self._lock:
            kept = self._answers.get(base_url)
        if kept is not None and now - kept[0] < MAX_AGE:
            return kept[1]
        # Two threads may both ask at expiry; that costs one extra call, not a wrong answer.
        answer = fetch(base_url)
        with self._lock:
            self._answers[base_url] = (time.monotonic(), answer)
        return answer

    def clear(self) -> None:
        with self._lock:
            self._answers.clear()


cache = _Cache()


def firing() -> Firing:
    """What fires now, at most MAX_AGE old."""
    return cache.get(settings.PROMETHEUS_URL)
