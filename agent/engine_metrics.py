"""Each engine's metrics under llmgw's names: one table, from which the Prometheus rules are generated.

Engines name the same quantity differently, and a version may rename one (vLLM's
`gpu_cache_usage_perc` became `kv_cache_usage_perc`). The table says, per engine and
per version, which series gives each of llmgw's signals; `rules()` turns it into the
recording rules of `deploy/rules/engines.rules.yml` (scripts/gen_engine_rules.py
writes it, a test checks it is current). Where several names give one signal the
rule takes the newest version's name first, so a version that exports both during a
deprecation is counted once. Only the standard library: the control plane and the
agent both import it.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from agent.engine_templates import version_key


class Signal(StrEnum):
    """llmgw's names: the recorded series, labelled node, shard, replica, model, engine and served_model."""

    REQUESTS_WAITING = "llmgw:shard_queue_depth"
    REQUESTS_RUNNING = "llmgw:shard_requests_running"
    TOKENS_PER_SECOND = "llmgw:shard_tokens_per_second"
    KV_CACHE_USAGE = "llmgw:shard_kv_cache_usage_ratio"


DESCRIPTIONS = {
    Signal.REQUESTS_WAITING: "requests waiting for a slot (queue depth)",
    Signal.REQUESTS_RUNNING: "requests being processed",
    Signal.TOKENS_PER_SECOND: "tokens generated per second",
    Signal.KV_CACHE_USAGE: "share of the KV cache in use, 0 to 1",
}


@dataclass(frozen=True)
class Source:
    metric: str
    # A counter is turned into a per-second rate; a gauge is taken as it is.
    counter: bool = False


@dataclass(frozen=True)
class Names:
    since: str  # the first engine version exporting these names
    signals: dict[Signal, Source]


# The labels the control plane's service discovery puts on every engine target.
LABELS = ("node", "shard", "replica", "model", "engine", "served_model")
RATE_WINDOW = "1m"

_VLLM_BEFORE_0_10 = {
    Signal.REQUESTS_WAITING: Source("vllm:num_requests_waiting"),
    Signal.REQUESTS_RUNNING: Source("vllm:num_requests_running"),
    Signal.TOKENS_PER_SECOND: Source("vllm:generation_tokens_total", counter=True),
    # A fraction despite its name: 1 is a full cache.
    Signal.KV_CACHE_USAGE: Source("vllm:gpu_cache_usage_perc"),
}
_VLLM = {**_VLLM_BEFORE_0_10, Signal.KV_CACHE_USAGE: Source("vllm:kv_cache_usage_perc")}

# Oldest first, per engine.
TABLE: dict[str, tuple[Names, ...]] = {
    "vllm": (Names("0", _VLLM_BEFORE_0_10), Names("0.10.0", _VLLM)),
    "sglang": (
        Names(
            "0",
            {
                Signal.REQUESTS_WAITING: Source("sglang:num_queue_reqs"),
                Signal.REQUESTS_RUNNING: Source("sglang:num_running_reqs"),
                Signal.TOKENS_PER_SECOND: Source("sglang:gen_throughput"),
                Signal.KV_CACHE_USAGE: Source("sglang:token_usage"),
            },
        ),
    ),
    # Versions are llama-cpp-python's, whose vendored llama.cpp is built (agent.engine_templates.PINNED).
    # The server of 0.3.36 exports no KV-cache gauge (kv_cache_usage_ratio was removed upstream);
    # its predicted_tokens_seconds is the mean speed of the requests since the last scrape,
    # not the server's output, so tokens per second come from the counter.
    "llama.cpp": (
        Names(
            "0",
            {
                Signal.REQUESTS_WAITING: Source("llamacpp:requests_deferred"),
                Signal.REQUESTS_RUNNING: Source("llamacpp:requests_processing"),
                Signal.TOKENS_PER_SECOND: Source("llamacpp:tokens_predicted_total", counter=True),
            },
        ),
    ),
    # The stand-in engine exports vLLM's names (agent/demo_engine.py).
    "demo": (Names("0", {k: v for k, v in _VLLM.items() if k != Signal.KV_CACHE_USAGE}),),
}


def names(engine: str, version: str = "") -> dict[Signal, Source]:
    """The signals `engine` exports at `version` (empty: the newest known); {} for an engine not in the table."""
    known = TABLE.get(engine, ())
    key = version_key(version)
    chosen = [n for n in known if not key or version_key(n.since) <= key]
    return dict(chosen[-1].signals) if chosen else {}


def sources(signal: Signal) -> list[Source]:
    """Every series that gives `signal`, newest version first, each once."""
    found: list[Source] = []
    for versions in TABLE.values():
        for entry in reversed(versions):
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


def absent_alert() -> dict:
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


def rules() -> dict:
    """The rule file's content, ready for YAML."""
    recording = [{"record": str(signal), "expr": expression(signal) + "\n"} for signal in Signal if sources(signal)]
    return {
        "groups": [
            {"name": "llmgw-engines-recording", "rules": recording},
            {"name": "llmgw-engines-alerts", "rules": [absent_alert()]},
        ]
    }
