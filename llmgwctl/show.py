"""How each answer is shown as text: tables for lists, a short report for one node."""

from __future__ import annotations

from llmgwctl.tables import age, cut, gib, table


def _percent(load: dict | None, key: str) -> str:
    if load is None:
        return "—"
    if key == "cpu":
        return f"{load['cpu_percent']:.0f}%"
    total = load["memory_used_bytes"] + load["memory_available_bytes"]
    return f"{100 * load['memory_used_bytes'] / total:.0f}%" if total else "—"


def _gpus(row: dict) -> str:
    gpus = row["gpus"]
    if not gpus["total"]:
        return "—"
    return f"{gpus['free']}/{gpus['total']} " + ",".join(gpus["classes"])


def nodes(rows: list[dict], wide: bool = False, width: int = 80) -> str:
    headers: tuple[str, ...]
    cells: list[tuple]
    if not wide:
        headers = ("NODE", "STATE", "CPU", "RAM", "GPUS FREE", "HEARTBEAT")
        cells = [
            (
                r["id"],
                r["state"],
                _percent(r["load"], "cpu"),
                _percent(r["load"], "ram"),
                _gpus(r),
                age(r["heartbeat_age_seconds"]),
            )
            for r in rows
        ]
        return table(headers, cells, width, shrink=(0, 4))
    headers = ("NODE", "HOSTNAME", "STATE", "CPU", "RAM", "LOAD", "GPUS FREE", "ENGINES", "HEARTBEAT", "LABELS")
    cells = [
        (
            r["id"],
            r["hostname"],
            r["state"],
            _percent(r["load"], "cpu"),
            _percent(r["load"], "ram"),
            f"{r['load']['load1']:.2f}" if r["load"] else "—",
            _gpus(r),
            str(r["engines"]),
            age(r["heartbeat_age_seconds"]),
            ",".join(f"{k}={v}" for k, v in sorted(r["labels"].items())) or "—",
        )
        for r in rows
    ]
    return table(headers, cells, width, shrink=(0, 1, 6, 9))


def node(n: dict, width: int = 80) -> str:
    load = n["load"]
    lines = [
        f"Node:       {n['id']} ({n['hostname'] or 'no hostname'})",
        f"State:      {n['state']} (admin {n['admin_state']}, {n['liveness']})",
    ]
    if n["admin_state_reason"]:
        lines.append(cut(f"Reason:     {n['admin_state_reason']} — {n['admin_state_by']}", width))
    lines.append(f"Heartbeat:  {age(n['heartbeat_age_seconds'])} ago")
    lines.append(cut(f"Host:       {n['os']} {n['os_version']}, kernel {n['kernel']}, {n['cpus']} CPUs", width))
    if load:
        lines.append(
            f"Load:       CPU {_percent(load, 'cpu')}, RAM {_percent(load, 'ram')} of "
            f"{gib(load['memory_used_bytes'] + load['memory_available_bytes'])}, "
            f"load {load['load1']:.2f} ({age(load['age_seconds'])} old)"
        )
    else:
        lines.append(f"Load:       unknown{' (' + n['load_problem'] + ')' if n['load_problem'] else ''}")
    labels = ", ".join(f"{k}={v}" for k, v in sorted(n["labels"].items())) or "—"
    lines.append(cut(f"Labels:     {labels}", width))
    # The server gives a drain's progress only while the node drains.
    if n["drain"] is not None:
        lines.append(f"Drain:      {n['drain']['replicas_left']} replicas left to move")
    if n["gpus"]:
        lines += ["", "GPUs:"]
        gpu_rows = [(str(g["index"]), g["gpu_class"], g["health"], g["held_by"] or "—") for g in n["gpus"]]
        lines.append(table(("INDEX", "CLASS", "HEALTH", "HELD BY"), gpu_rows, width, shrink=(2, 3)))
    if n["allocations"]:
        lines += ["", "Engines:"]
        engine_rows = [
            (a["shard"], a["state"] or "—", ",".join(map(str, a["gpus"])) or "—", a["model"]) for a in n["allocations"]
        ]
        lines.append(table(("SHARD", "STATE", "GPUS", "MODEL"), engine_rows, width, shrink=(0, 3)))
    if n["events"]:
        lines += ["", "Events:"]
        lines.append(events(n["events"][:5], width))
    return "\n".join(lines)


def events(items: list[dict], width: int = 80) -> str:
    rows = [
        (
            e["at"][:19].replace("T", " "),
            e["node"],
            f"{e['kind']} {e['from_state']}→{e['to_state']}" if e["to_state"] else e["kind"],
            e["actor"] or "—",
            e["reason"] or "—",
        )
        for e in items
    ]
    return table(("TIME", "NODE", "CHANGE", "BY", "REASON"), rows, width, shrink=(1, 3, 4))


def event_line(e: dict, width: int = 80) -> str:
    change = f"{e['kind']} {e['from_state']}→{e['to_state']}" if e["to_state"] else e["kind"]
    text = f"{e['at'][:19].replace('T', ' ')}  {e['node']}  {change}"
    if e["actor"]:
        text += f"  by {e['actor']}"
    if e["reason"]:
        text += f": {e['reason']}"
    return cut(text, width)


def deployments(rows: list[dict], width: int = 80) -> str:
    cells = []
    for d in rows:
        waiting = d["not_placed"][0]["reason"] if d["not_placed"] else "—"
        running = f"{d['replicas_running']}/{d['replicas_wanted']}"
        cells.append((d["name"], d["served_model_name"], d["engine"], running, str(len(d["not_placed"])), waiting))
    return table(("NAME", "MODEL", "ENGINE", "RUNNING", "PENDING", "WHY PENDING"), cells, width, shrink=(0, 1, 5))


def tenants(rows: list[dict], width: int = 80) -> str:
    def shown(limit) -> str:
        return "—" if limit is None else str(limit)

    cells = [
        (
            t["name"],
            "active" if t["active"] else "inactive",
            shown(t["requests_per_second"]),
            shown(t["concurrent_requests"]),
            shown(t["tokens_per_minute"]),
            shown(t["tokens_per_day"]),
            str(t.get("keys", 0)),
        )
        for t in rows
    ]
    return table(
        ("TENANT", "STATE", "RPS", "CONCURRENT", "TOKENS/MIN", "TOKENS/DAY", "KEYS"), cells, width, shrink=(0,)
    )


def usage(rows: list[dict], width: int = 80) -> str:
    cells = [
        (
            u["tenant"],
            u["model"],
            u["replica"],
            str(u["requests"]),
            str(u["prompt_tokens"]),
            str(u["completion_tokens"]),
        )
        for u in rows
    ]
    return table(("TENANT", "MODEL", "REPLICA", "REQUESTS", "PROMPT", "COMPLETION"), cells, width, shrink=(0, 1, 2))


def keys(rows: list[dict], width: int = 80) -> str:
    cells = []
    for k in rows:
        state = "revoked" if k["revoked_at"] else ("expires " + k["expires_at"][:10] if k["expires_at"] else "usable")
        cells.append((str(k["id"]), k["tenant"], k["prefix"] + "…", k["name"] or "—", k["created_at"][:10], state))
    return table(("ID", "TENANT", "KEY", "NAME", "MADE", "STATE"), cells, width, shrink=(3,))
