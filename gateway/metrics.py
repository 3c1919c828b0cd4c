"""The gateway's own series for Prometheus, `llmgw_gateway_*`, served by each gateway's sync.

Counted as the sync takes them from its HAProxy, so each gateway exports what passed through
it and Prometheus sums the gateways. Counters start again from zero when the sync restarts,
as Prometheus expects (rate() and increase() see the reset); the totals that survive
restarts are the database's (`Usage`, the operators' API).
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge
from prometheus_client.core import HistogramMetricFamily
from prometheus_client.registry import Collector

from gateway.counted import TTFT_BOUNDS, Counted, FirstTokens, Key, Where

LABELS = ("tenant", "model", "replica")
# The engines' series' names for the same things (their targets' labels), so the rules read both alike.
TTFT_LABELS = ["served_model", "replica"]


class FirstTokenHistogram(Collector):
    """`llmgw_gateway_time_to_first_token_seconds`: each stream's time from its request's arrival at this
    gateway to the first bytes of its answer, as HAProxy timed it, by served model and replica.

    The buckets come counted from HAProxy; prometheus_client's Histogram takes one observation at a
    time, so this holds the cumulative counts and writes them out as a histogram on each scrape.
    """

    def __init__(self) -> None:
        self.timed: dict[Where, FirstTokens] = {}

    def add(self, timed: dict[Where, FirstTokens]) -> None:
        for where, more in timed.items():
            self.timed.setdefault(where, FirstTokens()).add(more)

    def describe(self) -> Iterator[HistogramMetricFamily]:
        yield self._family()

    def collect(self) -> Iterator[HistogramMetricFamily]:
        family = self._family()
        bounds = [*(repr(b) for b in TTFT_BOUNDS), "+Inf"]
        for (model, replica), timed in sorted(self.timed.items()):
            cumulative, buckets = 0, []
            for bound, count in zip(bounds, timed.counts, strict=True):
                cumulative += count
                buckets.append((bound, cumulative))
            family.add_metric([model, replica], buckets, timed.sum_us / 1e6)
        yield family

    @staticmethod
    def _family() -> HistogramMetricFamily:
        return HistogramMetricFamily(
            "llmgw_gateway_time_to_first_token_seconds",
            "Streams' time from the request's arrival at the gateway to the first bytes of the answer,"
            " by served model and replica.",
            labels=TTFT_LABELS,
        )


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
        self.first_tokens = FirstTokenHistogram()
        self.registry.register(self.first_tokens)

    def taken(self, counted: dict[Key, Counted]) -> None:
        for key, more in counted.items():
            self.requests.labels(*key).inc(more.requests)
            self.prompt_tokens.labels(*key).inc(more.prompt_tokens)
            self.completion_tokens.labels(*key).inc(more.completion_tokens)
