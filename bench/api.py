"""Server time of the operators' API beside the cluster page's partial, at 10,000 nodes.

Runs alone: `python -m bench.api`. Like bench/pages.py it makes a SQLite
database in a temporary directory (or uses DATABASE_URL), starts a private
redis-server, fills a fleet in bulk (8 GPUs, two filesystems, an allocation and
a fresh load per node) and times requests through Django's full handling in
this process. In the same run and for the same rows, it times:

- the nodes list (a filter, a sort and one page of 100) through the API, and the
  cluster page's htmx partial asking for the same rows;
- one node's detail through the API, and the node page's live partial;

median and p95 of the wall time, and the number of queries each API request
asks at 1,000 and at 10,000 nodes (they must be equal).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from devstack.redis_server import RedisServer

ROOT = Path(__file__).resolve().parent.parent

ROUNDS = 40
WARMUP = 3
# The same rows both ways: ready nodes in zone a, one page of 100 (the page's fixed size).
FILTERS = "state=ready&label=zone%3Da"
SORTS = ("hostname", "-cpu")


def timed_pair(client, first: tuple[str, dict], second: tuple[str, dict]) -> tuple[list[float], list[float]]:
    """Both URLs' wall times, taken in turns, so a busy moment of a shared machine hits both alike."""
    for _ in range(WARMUP):
        for url, extra in (first, second):
            client.get(url, secure=True, **extra)
    times: tuple[list[float], list[float]] = ([], [])
    for _ in range(ROUNDS):
        for (url, extra), wall in zip((first, second), times, strict=True):
            started = time.perf_counter()
            response = client.get(url, secure=True, **extra)
            wall.append((time.perf_counter() - started) * 1000)
            assert response.status_code == 200, (url, response.status_code)
    return times


def p95(values: list[float]) -> float:
    return statistics.quantiles(values, n=20)[-1]


def main() -> int:
    workdir = Path(tempfile.mkdtemp(prefix="llmgw-bench-api-"))
    redis_server = RedisServer(workdir / "redis").start()
    os.environ.update(
        {
            "LLMGW_VAR_DIR": str(workdir),
            "REDIS_URL": redis_server.url,
            "DEBUG": "false",
            "SECRET_KEY": "bench-only-not-a-secret",
            "ALLOWED_HOSTS": "testserver",
            "DJANGO_SETTINGS_MODULE": "llmgw_site.settings",
        }
    )
    os.environ.setdefault("DATABASE_URL", f"sqlite:///{workdir / 'bench.sqlite3'}")
    try:
        return run()
    finally:
        redis_server.stop()


def run() -> int:
    import django

    django.setup()
    from django.contrib.auth.models import User
    from django.core.management import call_command
    from django.db import connection
    from django.test import Client
    from django.test.utils import CaptureQueriesContext

    from opsapi.forms import NewTokenForm
    from tests.factories import make_fleet

    call_command("migrate", verbosity=0)
    user = User.objects.create_user("bench-operator", password="x", is_staff=True)
    form = NewTokenForm({"name": "bench", "scope": "read", "lifetime_days": 30}, user=user)
    assert form.is_valid()
    _, secret = form.make()
    api = {"HTTP_AUTHORIZATION": f"Bearer {secret}"}
    htmx = {"HTTP_HX_REQUEST": "true"}
    client = Client()
    client.force_login(user)

    def queries(url: str) -> int:
        # One request first: the token's last use is written at most once a minute, not per request.
        client.get(url, secure=True, **api)
        with CaptureQueriesContext(connection) as captured:
            assert client.get(url, secure=True, **api).status_code == 200
        return len(captured)

    list_urls = {sort: f"/api/ops/v1/nodes/?{FILTERS}&sort={sort}&page_size=100" for sort in SORTS}
    counted: dict[str, list[int]] = {}
    results: list[dict[str, Any]] = []
    rows = []
    for size in (1_000, 10_000):
        make_fleet(size - (1_000 if size == 10_000 else 0), prefix=f"s{size}-")
        node = "s1000-00000"
        for sort, url in list_urls.items():
            counted.setdefault(f"api_nodes_list_sort_{sort.strip('-')}_queries", []).append(queries(url))
        counted.setdefault("api_node_detail_queries", []).append(queries(f"/api/ops/v1/nodes/{node}/"))

    def compare(name: str, api_url: str, page_url: str) -> None:
        api_wall, page_wall = timed_pair(client, (api_url, api), (page_url, htmx))
        for who, wall in (("api", api_wall), ("page", page_wall)):
            for stat, value in (("median", statistics.median(wall)), ("p95", p95(wall))):
                results.append(
                    {
                        "name": f"{name}_{who}_{stat}",
                        "value": round(value, 1),
                        "unit": "ms",
                        "target": None,
                        "better": "lower",
                    }
                )
        ratio = statistics.median(api_wall) / statistics.median(page_wall)
        # The target: the API no slower than the page.
        results.append(
            {"name": f"{name}_api_to_page", "value": round(ratio, 2), "unit": "ratio", "target": 1.0, "better": "lower"}
        )
        rows.append(
            (name, statistics.median(api_wall), p95(api_wall), statistics.median(page_wall), p95(page_wall), ratio)
        )

    for sort, url in list_urls.items():
        compare(f"nodes_list_sort_{sort.strip('-')}_10_000", url, f"/?{FILTERS}&sort={sort}")
    compare("node_detail_10_000", "/api/ops/v1/nodes/s1000-00000/", "/nodes/s1000-00000/")
    for name, (small, large) in counted.items():
        results.append(
            {"name": f"{name}_1_000_nodes", "value": small, "unit": "queries", "target": None, "better": "lower"}
        )
        results.append(
            {"name": f"{name}_10_000_nodes", "value": large, "unit": "queries", "target": small, "better": "lower"}
        )

    print(
        f"api: server time at 10,000 nodes, {ROUNDS} requests each, API and page in turns, database {connection.vendor}"
    )
    print("API: one page of 100 of the ready nodes in zone a; page: the cluster table's htmx partial, same rows;")
    print("node: the API's node detail beside the node page's live partial.")
    print()
    print("| figure | API median | API p95 | page median | page p95 | API ÷ page (target ≤ 1) |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    for name, a_med, a_p95, p_med, p_p95, ratio in rows:
        print(f"| {name} | {a_med:.1f} ms | {a_p95:.1f} ms | {p_med:.1f} ms | {p_p95:.1f} ms | {ratio:.2f} |")
    print()
    print("| queries per API request | 1,000 nodes | 10,000 nodes |")
    print("| --- | ---: | ---: |")
    for name, (small, large) in counted.items():
        print(f"| {name} | {small} | {large} |")
    out = ROOT / "bench" / "results" / "api.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2) + "\n")
    grew = [name for name, (small, large) in counted.items() if large != small]
    slower = [r["name"] for r in results if r["unit"] == "ratio" and r["value"] > r["target"]]
    if grew or slower:
        print(f"\nmissed targets: {', '.join(grew + slower)}")
    return 0


if __name__ == "__main__":
    # No options: --help says what it measures, as every benchmark's does.
    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args()
    sys.exit(main())
