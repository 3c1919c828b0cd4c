"""What the gateway did, from Prometheus, for the pages: a served model's charts, and requests in flight per replica.

The series are recorded by deploy/rules/gateway.rules.yml from HAProxy's exporter (requests,
5xx, requests in flight, per backend = served model and server = replica) and from the
gateways' own histogram of streams' time to first token (every engine's, llama.cpp's too), and
by deploy/rules/engines.rules.yml (tokens per second). docs/gateway.md, "Observing the gateway".
"""

from __future__ import annotations

from django.conf import settings

from agent.enginekinds import Signal
from nodes import promengines, promquery
from nodes.promengines import Answer
from nodes.promquery import ChartSpec

MODEL_LINE = "model total"
IN_FLIGHT_QUERY = "sum by (replica) (llmgw:gateway_replica_requests_in_flight)"


def model_charts(served_model: str) -> list[promquery.ChartSpec]:
    """The model page's charts: each by replica, and time to first token for the model as a whole too."""
    model = f"served_model={promquery.promql_string(served_model)}"
    return [
        ChartSpec(
            "requests",
            "Requests/s by replica",
            "per second",
            f"sum by (replica) (llmgw:gateway_replica_requests_per_second{{{model}}})",
            "replica",
        ),
        ChartSpec(
            "errors",
            "Errors (5xx)/s: the model, and by replica",
            "per second",
            # The model's line holds HAProxy's own 5xx too (no ready replica), which no replica's does;
            # its name has a space, which no replica id has.
            f'label_replace(sum(llmgw:gateway_model_errors_per_second{{{model}}}), "replica", "{MODEL_LINE}", "", "")'
            f" or sum by (replica) (llmgw:gateway_replica_errors_per_second{{{model}}})",
            "replica",
        ),
        ChartSpec(
            "ttft",
            "Time to first token",
            "seconds",
            f'label_replace(llmgw:model_ttft_seconds:p50{{{model}}}, "quantile", "p50", "", "")'
            f' or label_replace(llmgw:model_ttft_seconds:p99{{{model}}}, "quantile", "p99", "", "")',
            "quantile",
        ),
        ChartSpec(
            "ttft_replica",
            "Time to first token p99 by replica",
            "seconds",
            f"sum by (replica) (llmgw:replica_ttft_seconds:p99{{{model}}})",
            "replica",
        ),
        ChartSpec(
            "tokens",
            "Tokens/s by replica",
            "tokens/s",
            f"sum by (replica) ({Signal.TOKENS_PER_SECOND.value}{{{model}}})",
            "replica",
        ),
        ChartSpec(
            "in_flight",
            "Requests in flight by replica",
            "count",
            f"sum by (replica) (llmgw:gateway_replica_requests_in_flight{{{model}}})",
            "replica",
        ),
    ]


def in_flight_per_replica() -> Answer:
    """Requests in flight per replica at the gateways, summed over them, as last asked (nodes/promcache.py)."""
    base = settings.PROMETHEUS_URL
    return promengines.cache.get((base, "in_flight"), lambda: promengines.fetch(IN_FLIGHT_QUERY, "replica", base))


def tenant_charts(tenant: str, tokens_per_minute: int | None) -> list[promquery.ChartSpec]:
    """A tenant's charts, from the counters each gateway's sync exports (gateway/metrics.py), summed over gateways.

    Tokens per minute is drawn with the tenant's budget beside it when it has one; a rate over
    the last minute, so it approximates the UTC minute the budget counts.
    """
    who = f"tenant={promquery.promql_string(tenant)}"
    prompt = f"rate(llmgw_gateway_prompt_tokens_total{{{who}}}[1m])"
    completion = f"rate(llmgw_gateway_completion_tokens_total{{{who}}}[1m])"
    per_minute = f'label_replace(sum({prompt} + {completion}) * 60, "line", "tokens/min", "", "")'
    if tokens_per_minute is not None:
        per_minute += f' or label_replace(vector({tokens_per_minute}), "line", "budget", "", "")'
    return [
        ChartSpec("tokens", "Tokens/s by model", "tokens/s", f"sum by (model) ({prompt} + {completion})", "model"),
        ChartSpec(
            "kinds",
            "Prompt and completion tokens/s",
            "tokens/s",
            f'label_replace(sum({prompt}), "kind", "prompt", "", "")'
            f' or label_replace(sum({completion}), "kind", "completion", "", "")',
            "kind",
        ),
        ChartSpec("per_minute", "Tokens per minute, and the budget", "tokens/min", per_minute, "line"),
        ChartSpec(
            "requests",
            "Requests/s by model (answers whose usage was counted)",
            "per second",
            f"sum by (model) (rate(llmgw_gateway_requests_total{{{who}}}[1m]))",
            "model",
        ),
    ]
