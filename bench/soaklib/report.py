"""The soak's report: the whole result as JSON, a short Markdown page, and the benchmark figures."""

from __future__ import annotations

import json
from pathlib import Path


def figures(result: dict) -> list[dict]:
    """The headline numbers in the benchmarks' format ({"name", "value", "unit", "target", "better"})."""
    c = result["checks"]
    beats, metrics, memory = c["heartbeats"], c["metrics"], c["memory"].get("processes", {})
    rate = beats["error_rate_outside_outages"]
    rows = [
        ("heartbeats", beats["heartbeats"], "requests", None, "higher"),
        ("heartbeats per second achieved", beats["per_second_achieved"], "1/s", beats["per_second_offered"], "higher"),
        ("heartbeat error rate outside outages", None if rate is None else round(rate * 100, 4), "%", 0.1, "lower"),
        ("heartbeat p50 latency", beats["p50_ms"], "ms", None, "lower"),
        ("heartbeat p99 latency", beats["p99_ms"], "ms", None, "lower"),
        ("inventories lost or corrupted", c["inventory"]["missing"] + c["inventory"]["corrupted"], "nodes", 0, "lower"),
        ("nodes in a wrong state", c["states"]["wrong"], "nodes", 0, "lower"),
        ("GPUs allocated twice", len(c["allocations"]["gpus_claimed_twice"]), "GPUs", 0, "lower"),
        ("/metrics scrapes", metrics["scrapes"], "scrapes", None, "higher"),
        ("stale loads exported", metrics["stale_exports"], "series", 0, "lower"),
        ("series exported twice", metrics["duplicate_series"], "series", 0, "lower"),
    ]
    for name, row in memory.items():
        rows.append((f"RSS {name} at end", row["end_mib"], "MiB", None, "lower"))
    return [{"name": n, "value": v, "unit": u, "target": t, "better": b} for n, v, u, t, b in rows]


def markdown(result: dict) -> str:
    s, c, m = result["settings"], result["checks"], result["machine"]
    beats = c["heartbeats"]
    rate = beats["error_rate_outside_outages"]
    # Reports written before granian replaced gunicorn (docs/soak/latest.json is one) say "gunicorn_workers".
    workers = s.get("web_workers", s.get("gunicorn_workers"))
    lines = [
        f"# Soak report — {result['date']}",
        "",
        f"**{'PASSED' if result['ok'] else 'FAILED'}**: {s['minutes']:g} minutes, {s['nodes']} simulated nodes "
        f"and {s['agents']} real agents on {s['interval_s']:g} s beats; unreachable after "
        f"{s['unreachable_after_s']:g} s, lost after {s['lost_after_s']:g} s; {workers} web "
        f"workers; {s['database']}.",
        f"Machine: {m['host']}, {m['cpus']} CPUs, {m['memory_gib']} GiB, Python {m['python']}; load average at the "
        f"end {m['load_average_at_end']} (shared with other work, so latencies are noisy).",
        "",
        "| check | result | figures |",
        "| --- | --- | --- |",
        _row(
            "inventory intact",
            c["inventory"],
            f"{c['inventory']['nodes']} nodes; missing "
            f"{c['inventory']['missing']}, corrupted {c['inventory']['corrupted']}",
        ),
        _row(
            "node states",
            c["states"],
            f"{c['states']['nodes_checked']} nodes, wrong {c['states']['wrong']}; "
            + ", ".join(f"{k}: {v}" for k, v in c["states"]["final_states"].items()),
        ),
        _row(
            "transitions",
            c["transitions"],
            f"{c['transitions']['silenced_nodes']} silenced, missed "
            f"{c['transitions']['missed_transitions']}; excused by the control plane's grace periods "
            f"{c['transitions']['excused_by_grace_periods']}; marked unreachable without going silent: "
            f"{c['transitions']['marked_unreachable_without_going_silent']}",
        ),
        _row("allocations", c["allocations"], allocation_text(c["allocations"])),
        _row(
            "/metrics",
            c["metrics"],
            f"{c['metrics']['scrapes']} scrapes; stale loads {c['metrics']['stale_exports']}"
            f" (oldest ≤ {c['metrics']['oldest_load_exported_at_most_s']} s); series twice "
            f"{c['metrics']['duplicate_series']}",
        ),
        _row(
            "heartbeats",
            beats,
            f"{beats['heartbeats']} sent ({beats['per_second_achieved']}/s of {beats['per_second_offered']}/s "
            "offered); error rate outside outages "
            f"{'n/a' if rate is None else f'{rate * 100:.3f} %'} ({beats['errors_outside_outages']}); "
            f"p50 {beats['p50_ms']} ms, p99 {beats['p99_ms']} ms",
        ),
        _row("operator", c["operator"], f"{len(c['operator']['errors'])} failed admin actions"),
        _row(
            "clocks ±10 min",
            c["clock_skew"],
            f"{c['clock_skew']['nodes']} nodes, {c['clock_skew']['alive_at_end']} alive at the end",
        ),
        "",
        f"Warm-up (registration and first beats, not measured): {result['warm_up']['seconds']} s; nodes the "
        f"registration burst got marked unreachable meanwhile: {result['warm_up']['marked_unreachable']}.",
        "",
        "## Faults",
        "",
    ]
    lines += [f"- {e['t']:.0f} s: {e['event']}" for e in result["timeline"]]
    graces = result.get("grace_periods", {"periods_s": [], "seconds": 0})
    periods = ", ".join(f"{b:.0f}–{u:.0f} s" for b, u in graces["periods_s"]) or "none"
    lines += [
        "",
        f"Grace periods the control plane gave the fleet (no node marked; after its own outages, or while "
        f"heartbeats queued): {periods}; {graces['seconds']:g} s in all.",
    ]
    lines += ["", "## Memory (RSS, MiB)", "", "| process | start | end |", "| --- | --- | --- |"]
    for name, row in c["memory"].get("processes", {}).items():
        lines.append(f"| {name} | {row['start_mib']} | {row['end_mib']} |")
    return "\n".join(lines) + "\n"


def allocation_text(a: dict) -> str:
    text = (
        f"{a['allocations']} allocations; GPUs claimed twice {len(a['gpus_claimed_twice'])}; "
        f"left on lost nodes {len(a['allocations_on_lost_nodes'])}"
    )
    if "replicas_wanted" not in a or not a["replicas_wanted"]:
        return text + " (not exercised: no deployment placed any replica)"
    return text + (
        f"; replicas placed {a['replicas_placed_at_end']} of {a['replicas_wanted']} wanted; "
        f"{a['replicas_on_nodes_that_were_lost']} replicas were on nodes that went lost, "
        f"{len(a['of_those_still_live'])} of them still live"
    )


def _row(name: str, check: dict, text: str) -> str:
    return f"| {name} | {'ok' if check.get('ok', True) else '**FAILED**'} | {text} |"


def write(result: dict, out: Path, bench_results: Path | None) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / "latest.json", out / "latest.md"]
    paths[0].write_text(json.dumps(result, indent=1, default=str) + "\n")
    paths[1].write_text(markdown(result))
    if bench_results is not None:
        bench_results.parent.mkdir(parents=True, exist_ok=True)
        bench_results.write_text(json.dumps(figures(result), indent=1) + "\n")
        paths.append(bench_results)
    return paths


if __name__ == "__main__":
    # Render the Markdown again from a report's JSON: python -m bench.soaklib.report docs/soak/latest.json
    import sys

    source = Path(sys.argv[1])
    source.with_suffix(".md").write_text(markdown(json.loads(source.read_text())))
