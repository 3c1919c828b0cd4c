"""Server time of the tenant pages (`/tenants/`, `/tenants/<name>/`) with a thousand tenants and a day of usage.

Runs alone: `python -m bench.tenant_pages`. It makes a SQLite database in a temporary
directory (or uses DATABASE_URL), starts a private redis-server, and fills in bulk
1,000 tenants, each with 3 keys and 25 hours of hourly `Usage` rows (2 models × 2
replicas each; the timed tenant 20 models × 5 replicas: 2,500 rows of its own among
about 102,000) and this minute's tokens. It times the list, the tenant's page and
their htmx partials through Django's full request handling in this process (the time
a web worker spends, without the network). The charts are Prometheus' work and are
not timed here.

    python -m bench.tenant_pages
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

from bench.pages import ROUNDS, WARMUP, median_ms
from devstack.redis_server import RedisServer

ROOT = Path(__file__).resolve().parent.parent
TENANTS = 1_000
TIMED = "tenant-0000"


def fill() -> None:
    from datetime import timedelta

    from django.utils import timezone

    from gateway.models import ApiKey, Tenant, TokenMinute, Usage

    now = timezone.now()
    hour = now.replace(minute=0, second=0, microsecond=0)
    minute = now.replace(second=0, microsecond=0)
    tenants = Tenant.objects.bulk_create(
        Tenant(name=f"tenant-{i:04d}", tokens_per_day=10**7, tokens_per_minute=10**5, requests_per_second=20)
        for i in range(TENANTS)
    )
    keys = []
    for tenant in tenants:
        for k in range(3):
            key = ApiKey(tenant=tenant, name=f"service {k}")
            key.issue()
            keys.append(key)
    ApiKey.objects.bulk_create(keys)
    rows = []
    for tenant in tenants:
        models, replicas = (20, 5) if tenant.name == TIMED else (2, 2)
        for h in range(25):
            for m in range(models):
                for r in range(replicas):
                    rows.append(
                        Usage(
                            tenant=tenant.name,
                            model=f"model-{m}",
                            replica=f"model-{m}-r{r}",
                            hour=hour - timedelta(hours=h),
                            requests=10,
                            prompt_tokens=7_000,
                            completion_tokens=2_000,
                        )
                    )
    Usage.objects.bulk_create(rows, batch_size=5_000)
    TokenMinute.objects.bulk_create(TokenMinute(tenant=t.name, minute=minute, tokens=40_000) for t in tenants)


def run() -> int:
    import django

    django.setup()
    from django.contrib.auth.models import Permission, User
    from django.core.management import call_command
    from django.db import connection
    from django.test import Client

    from gateway.models import Usage

    call_command("migrate", verbosity=0)
    fill()
    # The pages need the admin's view-tenant permission (docs/pages.md), as an operator would have.
    user = User.objects.create_user("bench-viewer", password="x")
    user.user_permissions.add(Permission.objects.get(codename="view_tenant", content_type__app_label="gateway"))
    client = Client()
    client.force_login(user)
    htmx = {"HTTP_HX_REQUEST": "true"}
    figures = {
        "tenants_page": median_ms(client, "/tenants/"),
        "tenants_partial": median_ms(client, "/tenants/", **htmx),
        "tenant_page": median_ms(client, f"/tenants/{TIMED}/"),
        "tenant_partial": median_ms(client, f"/tenants/{TIMED}/", **htmx),
    }
    results: list[dict[str, Any]] = []
    for name, (wall, cpu) in figures.items():
        results.append({"name": name, "value": round(wall, 1), "unit": "ms", "better": "lower"})
        results.append({"name": f"{name}_cpu", "value": round(cpu, 1), "unit": "ms", "better": "lower"})
    print(
        f"tenant pages: {TENANTS:,} tenants, {Usage.objects.count():,} usage rows, database {connection.vendor};"
        f" median of {ROUNDS} requests after {WARMUP} warm-up (a shared machine: wall time includes waiting for a core)"
    )
    print()
    print("| request | wall (median) | CPU (median) |")
    print("| --- | ---: | ---: |")
    for name, (wall, cpu) in figures.items():
        print(f"| {name} | {wall:.1f} ms | {cpu:.1f} ms |")
    suffix = "" if connection.vendor == "sqlite" else f"-{connection.vendor}"
    out = ROOT / "bench" / "results" / f"tenant_pages{suffix}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2) + "\n")
    return 0


def main() -> int:
    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="llmgw-bench-tenant-pages-"))
    redis_server = RedisServer(workdir / "redis").start()
    os.environ.update(
        {
            "LLMGW_VAR_DIR": str(workdir),
            "REDIS_URL": redis_server.url,
            "DEBUG": "false",
            "SECRET_KEY": "bench-only-not-a-secret",
            "ALLOWED_HOSTS": "testserver",
            "LLMGW_REQUIRE_HTTPS": "false",
            "DJANGO_SETTINGS_MODULE": "llmgw_site.settings",
        }
    )
    os.environ.setdefault("DATABASE_URL", f"sqlite:///{workdir / 'bench.sqlite3'}")
    try:
        return run()
    finally:
        redis_server.stop()


if __name__ == "__main__":
    sys.exit(main())
