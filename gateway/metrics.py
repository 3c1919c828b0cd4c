"""The gateway's own series for Prometheus, `llmgw_gateway_*`, served by each gateway's sync.

Counted as the sync takes them from its HAProxy, so each gateway exports what passed through
it and Prometheus sums the gateways. Counters start again from zero when the sync restarts,
as Prometheus expects (rate() and increase() see the reset); the totals that survive
restarts are the database's (`Usage`, the operators' API).
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge

from gateway.counted import Counted, Key

LABELS = ("tenant", "model", "replica")


class GatewayMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.requests = Counter(
            "llmgw_gateway_requests",
            "Answers whose usage the engine reported, by tenant, served model and replica.",
            LABELS,
            registry=self.registry,
        )
        self.prompt_tokens = Counter(
            "llmgw_gateway_prompt_tokens",
            "Prompt tokens the engines reported, by tenant, served model and replica.",
            LABELS,
            registry=self.registry,
        )
        self.completion_tokens = Counter(
            "llmgw_gateway_completion_tokens",
            "Completion tokens the engines reported, by tenant, served model and replica.",
            LABELS,
            registry=self.registry,
        )
        self.over_budget = Gauge(
            "llmgw_gateway_tenants_over_budget",
            "Tenants refused because their token budget for the minute or the day is spent.",
            registry=self.registry,
        )
        self.unrecorded = Gauge(
            "llmgw_gateway_usage_unrecorded",
            "Answers counted but not yet written to the database (it was unreachable).",
            registry=self.registry,
        )

    def taken(self, counted: dict[Key, Counted]) -> None:
        for key, more in counted.items():
            self.requests.labels(*key).inc(more.requests)
            self.prompt_tokens.labels(*key).inc(more.prompt_tokens)
            self.completion_tokens.labels(*key).inc(more.completion_tokens)
