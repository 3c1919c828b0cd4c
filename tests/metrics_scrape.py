"""Reading /metrics back as samples, through prometheus_client's own parser."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

TEXT = "text/plain; version=0.0.4"


def body(response) -> str:
    return b"".join(response.streaming_content).decode()


def samples(text: str) -> dict[tuple[str, frozenset], float]:
    """{(sample name, frozenset of label pairs): value} for every sample of the text format."""
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def of(found: dict, name: str, **labels: str) -> float | None:
    return found.get((name, frozenset(labels.items())))


def named(found: dict, name: str) -> dict[frozenset, float]:
    return {labels: value for (sample, labels), value in found.items() if sample == name}
