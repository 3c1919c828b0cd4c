"""Registrations per second, and what one registration costs: queries, database and CPU time.

Runs alone: `python -m bench.registration [--nodes 1000]`. It starts a private
redis-server, uses the database DATABASE_URL names (default: a SQLite file in a
temporary directory; on PostgreSQL give an empty database of your own, which
it migrates and empties of nodes), and posts the fleet's registrations
(bench/fleetlib/bodies.py: the soak's machine classes, 8 GPUs, filesystems,
fabrics, weights and engine installs) one after the other through Django's
full request handling in this process, the way a web worker would serve
them, without the network. The registration limit per address is raised to
the fleet's size, as a fleet's bootstrap from behind one NAT needs.

Prints registrations/s, CPU ms and queries per registration, and the time
spent waiting on the database; with --profile, the top of a cProfile of the
whole run. Writes bench/results/registration[-<vendor>].json.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import os
import pstats
import random
import sys
import tempfile
import time
from pathlib import Path

from devstack.redis_server import RedisServer

ROOT = Path(__file__).resolve().parent.parent
JOIN_TOKEN = "bench-join-token"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=1_000)
    parser.add_argument("--profile", action="store_true", help="print the top of a cProfile of the registrations")
    args = parser.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="llmgw-bench-registration-"))
    redis_server = RedisServer(workdir / "redis").start()
    os.environ.update(
        {
            "LLMGW_VAR_DIR": str(workdir),
            "REDIS_URL": redis_server.url,
            "DEBUG": "false",
            "SECRET_KEY": "bench-only-not-a-secret",
            "ALLOWED_HOSTS": "testserver",
            "DJANGO_SETTINGS_MODULE": "llmgw_site.settings",
            "LLMGW_JOIN_TOKEN": JOIN_TOKEN,
            "LLMGW_REGISTER_PER_MINUTE": str(max(args.nodes * 2, 100)),
        }
    )
    os.environ.setdefault("DATABASE_URL", f"sqlite:///{workdir / 'bench.sqlite3'}")
    try:
        return run(args)
    finally:
        redis_server.stop()


def run(args: argparse.Namespace) -> int:
    import django

    django.setup()
    from django.core.management import call_command
    from django.db import connection
    from django.test import Client

    from agent import protocol
    from bench.fleetlib import bodies
    from inventory.models import Node

    call_command("migrate", verbosity=0)
    Node.objects.all().delete()
    client = Client()
    headers = {"HTTP_AUTHORIZATION": f"Bearer {JOIN_TOKEN}"}
    payloads = [protocol.encode(bodies.registration(i, random.Random(i))[0]) for i in range(args.nodes)]

    database_seconds = 0.0
    queries = 0
    # Seconds and count by statement kind and table ("INSERT inventory_gpu"), to say where the wait goes.
    by_statement: dict[str, list[float]] = {}

    def timed(execute, sql, params, many, context):
        nonlocal database_seconds, queries
        started = time.perf_counter()
        try:
            return execute(sql, params, many, context)
        finally:
            took = time.perf_counter() - started
            database_seconds += took
            queries += 1
            entry = by_statement.setdefault(statement_kind(sql), [0.0, 0])
            entry[0] += took
            entry[1] += 1

    profile = cProfile.Profile() if args.profile else None
    started, started_cpu = time.perf_counter(), time.process_time()
    with connection.execute_wrapper(timed):
        if profile is not None:
            profile.enable()
        for payload in payloads:
            response = client.post(
                "/api/v1/register", data=payload, content_type="application/json", secure=True, **headers
            )
            assert response.status_code == 200, (response.status_code, response.content[:500])
        if profile is not None:
            profile.disable()
    wall = time.perf_counter() - started
    cpu = time.process_time() - started_cpu
    assert Node.objects.count() == args.nodes

    vendor = connection.vendor
    figures = [
        ("nodes", args.nodes, "nodes", None, "higher"),
        ("registrations_per_second", args.nodes / wall, "1/s", None, "higher"),
        ("registration_wall_ms", 1000 * wall / args.nodes, "ms", None, "lower"),
        ("registration_cpu_ms", 1000 * cpu / args.nodes, "ms", None, "lower"),
        ("registration_database_wait_ms", 1000 * database_seconds / args.nodes, "ms", None, "lower"),
        ("registration_queries", queries / args.nodes, "queries", None, "lower"),
    ]
    print(f"registration: {args.nodes} nodes one after the other, in process, database {vendor}\n")
    print("| figure | value | unit |")
    print("| --- | ---: | --- |")
    for name, value, unit, _, _ in figures:
        print(f"| {name} | {value:,.1f} | {unit} |")
    print("\n| statement | per registration | ms per registration |")
    print("| --- | ---: | ---: |")
    for kind, (seconds, count) in sorted(by_statement.items(), key=lambda item: -item[1][0]):
        print(f"| {kind} | {count / args.nodes:.2f} | {1000 * seconds / args.nodes:.2f} |")
    if profile is not None:
        print()
        pstats.Stats(profile).sort_stats("cumulative").print_stats(30)
    suffix = "" if vendor == "sqlite" else f"-{vendor}"
    out = ROOT / "bench" / "results" / f"registration{suffix}.json"
    out.write_text(
        json.dumps(
            [{"name": n, "value": round(v, 3), "unit": u, "target": t, "better": b} for n, v, u, t, b in figures],
            indent=2,
        )
        + "\n"
    )
    return 0


def statement_kind(sql: str) -> str:
    """The statement's verb and first table: `INSERT inventory_gpu`, `SAVEPOINT`."""
    words = sql.replace('"', "").split()
    verb = words[0].upper() if words else "?"
    for marker in ("INTO", "FROM", "UPDATE"):
        if marker in words[1:]:
            index = words.index(marker, 1) if marker != "UPDATE" else 0
            if index + 1 < len(words):
                return f"{verb} {words[index + 1]}"
    return verb


if __name__ == "__main__":
    sys.exit(main())
