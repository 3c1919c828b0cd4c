"""The Prometheus rules of every engine kind's metrics, under llmgw's names.

Engines name the same quantity differently, and a version may rename one (vLLM's
`gpu_cache_usage_perc` became `kv_cache_usage_perc`). Each kind's record says, per
version, which series gives each of llmgw's signals; `rules()` turns them into the
recording rules of `deploy/rules/engines.rules.yml` (scripts/gen_engine_rules.py
writes it, a test checks it is current). Where several names give one signal the
rule takes the newest version's name first, so a version that exports both during a
deprecation is counted once. Only the standard library: the control plane and the
agent both import it.
"""

from __future__ import annotations

from typing import Any

from agent.enginekinds import BY_NAME, KINDS
from agent.enginekinds.record import Signal, Source

# The labels the control plane's service discovery puts on every engine target.
LABELS = ("node", "shard", "replica", "model", "engine", "served_model")
RATE_WINDOW = "1m"


def names(engine: str, version: str = "") -> dict[Signal, Source]:
    """The signals `engine` exports at `version` (empty: the newest known); {} for a kind llmgw does not know."""
    kind = BY_NAME.get(engine)
    return kind.metric_names(version) if kind else {}


def sources(signal: Signal) -> list[Source]:
    """Every series that gives `signal`, newest version first, each once."""
    found: list[Source] = []
    for kind in KINDS:
        for entry in reversed(kind.metrics):
            source = entry.signals.get(signal)
            if source is not None and source not in found:
                found.append(source)
    return found


def all_metrics() -> list[str]:
    return sorted({source.metric for signal in Signal for source in sources(signal)})


def expression(signal: Signal) -> str:
    by = f"sum by ({', '.join(LABELS)})"
    terms = [f"{by} (rate({s.metric}[{RATE_WINDOW}]))" if s.counter else f"{by} ({s.metric})" for s in sources(signal)]
    return "\nor\n".join(terms)


# How long a running shard may export none of the table's series before the alert fires.
ABSENT_FOR = "5m"


def absent_alert() -> dict[str, Any]:
    # A shard runs when the control plane reports its engine's processes (llmgw_shard_cpu_cores);
    # its engine is silent when no series of the table carries its shard label. Only shards with
    # an allocation (a replica) are engine targets (nodes/targets.py): a process an agent reports
    # that placement never put there is not scraped, so its silence says nothing. Leaving those
    # out also keeps Prometheus from holding a pending alert, with its annotations expanded at
    # every evaluation, for each of them (bench/heartbeat.py's fleet runs only such shards).
    pattern = "|".join(all_metrics())
    return {
        "alert": "LLMGWEngineMetricsAbsent",
        "expr": (
            'max by (node, shard, replica, model) (llmgw_shard_cpu_cores{replica!=""})\n'
            f'unless on (shard) group by (shard) ({{job="llmgw-engines",__name__=~"{pattern}"}})\n'
        ),
        "for": ABSENT_FOR,
        "labels": {"severity": "warning"},
        "annotations": {
            "summary": (
                "Shard {{ $labels.shard }} ({{ $labels.model }}) on {{ $labels.node }} exports no engine metrics"
            ),
            "description": (
                "The shard's engine runs, but Prometheus has none of its queue, running-request, token or "
                "KV-cache series: it does not export them (SGLang without --enable-metrics, llama-server "
                "without --metrics, an engine llmgw does not know) or its target is not scraped."
            ),
        },
    }


def rules() -> dict[str, Any]:
    """The rule file's content, ready for YAML."""
    recording = [{"record": str(signal), "expr": expression(signal) + "\n"} for signal in Signal if sources(signal)]
    return {
        "groups": [
            {"name": "llmgw-engines-recording", "rules": recording},
            {"name": "llmgw-engines-alerts", "rules": [absent_alert()]},
        ]
    }
