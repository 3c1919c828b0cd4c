"""What the soak checks: /metrics while it runs, and the database once it is over.

Each check returns plain data (counts and the first few offenders) so the report
can say exactly what failed; none of them trusts the control plane's own view
of what it was sent: the simulator's record is the reference.
"""

from __future__ import annotations

import re
import statistics
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

from bench.soaklib.fleet import Request, SimNode

# Metrics whose value comes from a load (and so must be fresh); the others come from the inventory.
LOAD_METRICS = frozenset(
    {
        "llmgw_node_cpu_utilization_percent",
        "llmgw_node_cpus",
        "llmgw_node_load",
        "llmgw_node_memory_used_bytes",
        "llmgw_node_memory_available_bytes",
        "llmgw_shard_cpu_cores",
        "llmgw_shard_memory_bytes",
    }
)
SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+\S+")
NODE_LABEL = re.compile(r'(?:^|[{,])node="((?:[^"\\]|\\.)*)"')
SHOW = 10  # offenders named in the report per check


@dataclass
class MetricsAudit:
    """/metrics sampled through the run: stale loads and series exported twice."""

    max_age: float
    scrapes: int = 0
    failed_scrapes: int = 0
    nodes_with_load_max: int = 0
    stale: list[dict] = field(default_factory=list)
    duplicates: list[dict] = field(default_factory=list)
    stale_count: int = 0
    duplicate_count: int = 0
    worst_age: float = 0.0
    scrape_seconds: list[float] = field(default_factory=list)

    def audit(self, text: str, started: float, finished: float, nodes: dict[str, SimNode]) -> None:
        """Check one scrape that ran from `started` to `finished` (wall clock)."""
        self.scrapes += 1
        self.scrape_seconds.append(finished - started)
        series: Counter[tuple[str, str]] = Counter()
        loaded: set[str] = set()
        for line in text.splitlines():
            if not line or line[0] == "#":
                continue
            match = SAMPLE.match(line)
            if match is None:
                continue
            name, labels = match.group(1), match.group(2) or ""
            series[(name, labels)] += 1
            if name in LOAD_METRICS:
                found = NODE_LABEL.search(labels)
                if found:
                    loaded.add(found.group(1))
        for (name, labels), count in series.items():
            if count > 1 and len(self.duplicates) < SHOW:
                self.duplicates.append({"at": started, "series": name + labels, "times": count})
        self.duplicate_count += sum(1 for c in series.values() if c > 1)
        self.nodes_with_load_max = max(self.nodes_with_load_max, len(loaded))
        for node_id in loaded:
            node = nodes.get(node_id)
            if node is None:
                continue  # a real agent: the simulator does not know when it last sent
            # The newest load the control plane can hold arrived before this; the scrape began after `started`.
            newest = finished if node.inflight else node.stored_until
            age = started - newest
            self.worst_age = max(self.worst_age, age)
            if age > self.max_age:
                if len(self.stale) < SHOW:
                    self.stale.append({"at": started, "node": node_id, "age_at_least": round(age, 1)})
                self.stale_count += 1

    def summary(self) -> dict:
        return {
            "scrapes": self.scrapes,
            "failed_scrapes": self.failed_scrapes,
            "most_nodes_with_a_load": self.nodes_with_load_max,
            "stale_exports": self.stale_count,
            "stale_examples": self.stale,
            "oldest_load_exported_at_most_s": round(self.worst_age, 1),
            "duplicate_series": self.duplicate_count,
            "duplicate_examples": self.duplicates,
            "scrape_seconds_median": round(statistics.median(self.scrape_seconds), 3) if self.scrape_seconds else None,
            "ok": self.scrapes > 0 and not self.stale and not self.duplicates,
        }


def overlaps(request: Request, windows: list[tuple[float, float]]) -> bool:
    end = request.at + request.seconds
    return any(request.at <= stop and end >= start for start, stop in windows)


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(int(q * len(ordered)), len(ordered) - 1)]


def heartbeat_summary(
    requests: list[Request], outages: list[tuple[float, float]], since: float, until: float, offered: float
) -> dict:
    """Error rate and latency of heartbeats after warm-up, with and without the injected outages.

    `offered` is the rate the fleet would send if every answer came at once; the
    simulator never sends a node's next beat before its last was answered, so a
    slow control plane shows as a lower achieved rate, not as a queue.
    """
    beats = [r for r in requests if r.kind == "heartbeat" and r.at >= since]
    outside = [r for r in beats if not overlaps(r, outages)]
    errors = [r for r in outside if r.status != 200]
    kinds = Counter(r.error or str(r.status) for r in errors)
    latencies = [r.seconds for r in outside if r.status == 200]
    all_latencies = [r.seconds for r in beats if r.status == 200]
    rate = len(errors) / len(outside) if outside else None
    return {
        "heartbeats": len(beats),
        "per_second_offered": round(offered, 1),
        "per_second_achieved": round(len(beats) / max(until - since, 1e-9), 1),
        "heartbeats_outside_outages": len(outside),
        "errors_outside_outages": len(errors),
        "error_kinds_outside_outages": dict(kinds),
        "error_rate_outside_outages": rate,
        "errors_during_outages": sum(1 for r in beats if r.status != 200) - len(errors),
        "p50_ms": _ms(percentile(latencies, 0.5)),
        "p99_ms": _ms(percentile(latencies, 0.99)),
        "max_ms": _ms(max(latencies) if latencies else None),
        "p99_ms_including_outages": _ms(percentile(all_latencies, 0.99)),
        "ok": rate is not None and rate < 0.001,
    }


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000, 1)


# -- after the run, against the database ------------------------------------------------------


def inventory_check(nodes: list[SimNode]) -> dict:
    """Every simulated node's rows hold exactly the last inventory the simulator sent."""
    from inventory.models import Node

    stored = {
        node.pk: node
        for node in Node.objects.filter(pk__in=[n.node_id for n in nodes]).prefetch_related(
            "gpus", "filesystems", "weights", "fabrics", "engine_installs"
        )
    }
    missing, wrong, unacknowledged = [], [], 0
    for sim in nodes:
        row = stored.get(sim.node_id)
        if row is None:
            missing.append(sim.node_id)
            continue
        if sim.acknowledged_hash != sim.digest:
            unacknowledged += 1  # its last change never got through: compare with what did
        differences = compare(row, sim)
        if differences and sim.acknowledged_hash == sim.digest:
            wrong.append({"node": sim.node_id, "differences": differences[:5]})
    return {
        "nodes": len(nodes),
        "missing": len(missing),
        "missing_examples": missing[:SHOW],
        "corrupted": len(wrong),
        "corrupted_examples": wrong[:SHOW],
        "last_change_not_acknowledged": unacknowledged,
        "ok": not missing and not wrong,
    }


def compare(row, sim: SimNode) -> list[str]:
    inv = sim.inventory
    found = []

    def same(what: str, have, want) -> None:
        if have != want:
            found.append(f"{what}: stored {have!r}, sent {want!r}")

    same("hostname", row.hostname, inv.hostname)
    same("mgmt_addr", row.mgmt_addr, inv.mgmt_addr)
    same("labels", row.labels, dict(inv.labels))
    same("memory", row.memory_total_bytes, inv.memory_total_bytes)
    same("cpus", row.cpus, inv.host.cpus)
    same("cpu_model", row.cpu_model, inv.host.cpu_model)
    same("engines", row.engine_versions, dict(inv.engine_versions))
    same("inventory_hash", row.inventory_hash, sim.digest)
    same(
        "gpus",
        sorted((g.index, g.uuid, g.name, g.memory_bytes, g.health) for g in row.gpus.all()),
        sorted((g.index, g.uuid, g.name, g.memory_bytes, g.health) for g in inv.gpus),
    )
    same(
        "filesystems",
        sorted((f.mount, f.total_bytes, f.free_bytes, f.shared) for f in row.filesystems.all()),
        sorted((f.mount, f.total_bytes, f.free_bytes, f.shared) for f in inv.filesystems),
    )
    same(
        "weights",
        sorted((w.path, w.size_bytes) for w in row.weights.all()),
        sorted((w.path, w.size_bytes) for w in inv.weights),
    )
    same(
        "fabrics",
        sorted((f.fabric, tuple(f.hcas), f.rate_gbps) for f in row.fabrics.all()),
        sorted((f.name, tuple(f.hcas), f.rate_gbps) for f in inv.fabrics),
    )
    same(
        "engine installs",
        sorted((e.engine, e.version, e.state) for e in row.engine_installs.all()),
        sorted((e.engine, e.version, e.state) for e in inv.provision),
    )
    return found


def state_check(expected_liveness: dict[str, set[str]], expected_admin: dict[str, set[str]]) -> dict:
    """Each node's liveness and admin state is one of those the schedule allows."""
    from inventory.models import Node

    ids = set(expected_liveness) | set(expected_admin)
    rows = dict(
        (pk, (liveness, admin)) for pk, liveness, admin in Node.objects.values_list("pk", "liveness", "admin_state")
    )
    wrong = []
    for node_id in sorted(ids):
        liveness, admin = rows.get(node_id, (None, None))
        want_liveness = expected_liveness.get(node_id)
        want_admin = expected_admin.get(node_id)
        if (want_liveness and liveness not in want_liveness) or (want_admin and admin not in want_admin):
            wrong.append(
                {
                    "node": node_id,
                    "liveness": liveness,
                    "expected_liveness": sorted(want_liveness or []),
                    "admin_state": admin,
                    "expected_admin_state": sorted(want_admin or []),
                }
            )
    by_state = Counter(rows[node_id] for node_id in ids if node_id in rows)
    return {
        "nodes_checked": len(ids),
        "wrong": len(wrong),
        "wrong_examples": wrong[:SHOW],
        "final_states": {f"{liveness}/{admin}": count for (liveness, admin), count in sorted(by_state.items())},
        "ok": not wrong,
    }


def transitions_check(
    required: dict[str, set[str]], never_silent: list[str], since: float, excused: Sequence[str] = ()
) -> dict:
    """Nodes silenced past a threshold were marked so on the way; the others only in outages, if at all.

    `excused` are the silenced nodes a grace period of the control plane's let
    off a state (bench/soaklib/graces.py): counted, so that a run where grace
    periods excused most of the fleet shows it.
    """
    from datetime import UTC, datetime

    from inventory.models import NodeEvent

    after = datetime.fromtimestamp(since, tz=UTC)
    events = NodeEvent.objects.filter(kind=NodeEvent.Kind.LIVENESS, at__gte=after).values_list("node_id", "to_state")
    reached: dict[str, set[str]] = {}
    for node_id, to_state in events:
        reached.setdefault(node_id, set()).add(to_state)
    missed = [
        {"node": node_id, "expected_one_of": sorted(want), "saw": sorted(reached.get(node_id, ()))}
        for node_id, want in sorted(required.items())
        if not want & reached.get(node_id, set())
    ]
    spurious = sorted(node_id for node_id in never_silent if reached.get(node_id, set()) - {"alive"})
    return {
        "silenced_nodes": len(required),
        "excused_by_grace_periods": len(excused),
        "excused_examples": sorted(excused)[:SHOW],
        "missed_transitions": len(missed),
        "missed_examples": missed[:SHOW],
        # Nodes that never went quiet but were marked unreachable: the control plane missed their beats.
        "marked_unreachable_without_going_silent": len(spurious),
        "spurious_examples": spurious[:SHOW],
        "ok": not missed,
    }
