"""Save docs/screenshots/cluster.png, node.png and tenant.png from a running demo stack (`make screenshots`).

With --url it photographs a stack that is already running (log in with --user
and --password, or the password `make run` kept in var/admin-password). Without
it, it starts a demo stack of its own on free ports in a temporary directory
(redis, granian, prometheus, as `make run` does), fills it with a demo fleet,
waits for Prometheus to scrape it a few times, and stops it afterwards.

Browsers: Debian's chromium driven by the playwright package, as in the tests.
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path

from devstack.chromium import CHROMIUM, CHROMIUM_ARGS
from devstack.ports import free_port
from devstack.stack import Stack

ROOT = Path(__file__).resolve().parent.parent

OUT = ROOT / "docs" / "screenshots"
DEMO_NODE = "gpu-a03"
DEMO_TENANT = "search-team"
# Long enough for Prometheus (scraping every 15 s) to hold a few points for the charts.
PROMETHEUS_WARMUP = 65


def seed_demo_fleet(var: Path, redis_url: str) -> None:
    """Forty nodes in every state, with GPUs, disks, engines and loads, written straight to the stack's stores."""
    os.environ.update(
        {
            "LLMGW_VAR_DIR": str(var),
            "REDIS_URL": redis_url,
            "DJANGO_SETTINGS_MODULE": "llmgw_site.settings",
            "DEBUG": "true",
        }
    )
    import django

    django.setup()
    from django.contrib.auth import get_user_model
    from django.utils import timezone

    from agent import protocol
    from inventory.models import Allocation, GPUClaim, Liveness, Node
    from inventory.operator import ACTIONS, set_admin_state
    from inventory.registration import upsert_inventory

    rng = random.Random(7)
    kinds = [("a", "NVIDIA H100 80GB HBM3", 8, 80), ("b", "NVIDIA A100-SXM4-40GB", 8, 40), ("c", "NVIDIA L40S", 4, 48)]
    admin = get_user_model().objects.filter(is_superuser=True).first()
    for n in range(40):
        letter, gpu_name, gpus, gpu_gib = kinds[n % 3]
        node_id = f"gpu-{letter}{n:02d}"
        inventory = protocol.Inventory(
            hostname=f"{node_id}.dc1.example",
            mgmt_addr=f"10.1.{n // 10}.{n % 10 + 10}",
            labels={"rack": f"r{n // 8 + 1}", "zone": "east" if n % 2 else "west"},
            memory_total_bytes=(1024 if letter == "a" else 512) * 2**30,
            host=protocol.Host(
                os="Debian GNU/Linux",
                os_version="12",
                kernel="6.1.0-28-amd64",
                arch="x86_64",
                cpu_model="AMD EPYC 9654 96-Core",
                cpus=192 if letter == "a" else 128,
            ),
            agent_version="0.1.0",
            engine_versions={"vllm": "0.9.1", "llama.cpp": "b5120"},
            engines_probed=True,
            provision=[protocol.EngineInstall(engine="vllm", version="0.9.1", variant="cuda12", state="ready")],
            gpus=[
                protocol.GPU(
                    index=i,
                    uuid=f"GPU-{node_id}-{i}",
                    name=gpu_name,
                    memory_bytes=gpu_gib * 2**30,
                    health="ok" if (n, i) != (7, 3) else "ECC errors: 14 uncorrectable",
                )
                for i in range(gpus)
            ],
            filesystems=[
                protocol.Filesystem(
                    mount="/var/lib/models", fstype="xfs", total_bytes=7 * 2**40, free_bytes=rng.randint(1, 6) * 2**40
                ),
                protocol.Filesystem(
                    mount="/mnt/filer", fstype="nfs4", total_bytes=2**47, free_bytes=2**46, shared=True
                ),
            ],
            weights=[
                protocol.Weights(
                    path="/var/lib/models/meta-llama/Llama-3.1-70B-Instruct",
                    size_bytes=141 * 2**30,
                    format="safetensors",
                )
            ],
            weights_scanned=True,
            fabrics=[protocol.Fabric(name="ib-east", hcas=["mlx5_0", "mlx5_1"], rate_gbps=400)]
            if letter == "a"
            else [],
        )
        upsert_inventory(node_id, inventory)
        if n % 3 != 2 and n % 5 != 4:
            model = "meta-llama/Llama-3.1-70B-Instruct" if letter == "a" else "Qwen/Qwen2.5-32B-Instruct"
            allocation = Allocation.objects.get_or_create(
                shard_id=f"{node_id}-s0",
                defaults={"node_id": node_id, "replica_id": f"r{n // 2:02d}", "model": model, "memory_gb": 160},
            )[0]
            for i in range(4):
                GPUClaim.objects.get_or_create(allocation=allocation, node_id=node_id, gpu_index=i)
    now = timezone.now()
    Node.objects.filter(pk__in=["gpu-b13", "gpu-c29"]).update(
        liveness=Liveness.UNREACHABLE, last_heartbeat=now - timedelta(seconds=47)
    )
    Node.objects.filter(pk="gpu-a36").update(liveness=Liveness.LOST, last_heartbeat=now - timedelta(minutes=12))
    if admin is not None:
        set_admin_state(Node.objects.get(pk="gpu-b10"), ACTIONS["cordon"], admin, "replacing a fan")
        set_admin_state(Node.objects.get(pk="gpu-a21"), ACTIONS["drain"], admin, "kernel upgrade")
        set_admin_state(Node.objects.get(pk=DEMO_NODE), ACTIONS["cordon"], admin, "burn-in after GPU swap")
        set_admin_state(Node.objects.get(pk=DEMO_NODE), ACTIONS["uncordon"], admin, "burn-in passed")


def seed_demo_tenants() -> None:
    """Three tenants with keys and a day of usage, recorded by the hour as the gateway's sync records it."""
    from django.utils import timezone

    from gateway import usage
    from gateway.counted import Counted
    from gateway.models import ApiKey, Tenant

    rng = random.Random(11)
    now = timezone.now()
    tenants = [
        Tenant.objects.create(
            name=DEMO_TENANT, tokens_per_day=40_000_000, tokens_per_minute=150_000, requests_per_second=50
        ),
        Tenant.objects.create(name="support-bot", tokens_per_day=2_000_000, concurrent_requests=16),
        Tenant.objects.create(name="batch-eval", active=False),
    ]
    for tenant, names in zip(tenants, (["indexer", "web", "notebook"], ["prod"], ["nightly"]), strict=True):
        for i, name in enumerate(names):
            key = ApiKey(tenant=tenant, name=name, created_at=now - timedelta(days=30 - 7 * i))
            key.issue()
            key.save()
            if name == "notebook":
                key.revoke(by="admin")
    models = [("llama-70b", ["r00", "r01", "r02"]), ("qwen-32b", ["r10", "r11"])]
    for hours_ago in range(24, -1, -1):
        # Two minutes back: this minute gets a minute's worth below, not an hour's.
        at = now - timedelta(hours=hours_ago, minutes=2)
        # Busier in the working hours of the day, as people are.
        busy = 0.3 + 0.7 * max(0.0, 1 - abs(at.hour - 14) / 8)
        counted = {}
        for tenant, scale in ((DEMO_TENANT, 1.0), ("support-bot", 0.06)):
            for model, replicas in models:
                for replica in replicas:
                    requests = int(rng.uniform(300, 900) * busy * scale) + 1
                    counted[(tenant, model, replica)] = Counted(
                        requests, requests * rng.randint(600, 900), requests * rng.randint(150, 300)
                    )
        usage.record(counted, now=at)
    seed_demo_minute()


def seed_demo_minute() -> None:
    """A minute's worth of the demo tenant's tokens, this minute (the page shows it against the minute's budget)."""
    from gateway import usage
    from gateway.counted import Counted

    usage.record({(DEMO_TENANT, "llama-70b", "r01"): Counted(45, 45 * 700, 45 * 210)})


def save_demo_loads() -> None:
    """Fresh loads for every live node (a load is shown for 60 s only)."""
    from django.utils import timezone

    from agent.protocol import Load, ShardLoad
    from inventory.models import Liveness, Node
    from livestate import loadstore

    jitter = random.Random(time.time())
    now = time.time()
    # Heartbeats would move these; the demo has no agents.
    Node.objects.filter(liveness=Liveness.ALIVE).update(last_heartbeat=timezone.now())
    for node in Node.objects.filter(liveness=Liveness.ALIVE).prefetch_related("allocations"):
        # Each node keeps its own level, moving a little from one heartbeat to the next.
        rng = random.Random(node.pk)
        total = node.memory_total_bytes
        used = int(total * min(rng.uniform(0.2, 0.9) + jitter.uniform(-0.03, 0.03), 0.99))
        loadstore.save(
            node.pk,
            Load(
                cpu_percent=round(min(max(rng.uniform(3, 97) + jitter.uniform(-6, 6), 0), 100), 1),
                cpus=node.cpus,
                load1=round(rng.uniform(1, 80), 2),
                load5=round(rng.uniform(1, 70), 2),
                load15=round(rng.uniform(1, 60), 2),
                memory_used_bytes=used,
                memory_available_bytes=total - used,
                interval_seconds=5,
                shards=[
                    ShardLoad(
                        shard=a.shard_id, cpu_cores=round(rng.uniform(1, 12), 2), rss_bytes=rng.randint(40, 150) * 2**30
                    )
                    for a in node.allocations.all()
                ],
            ),
            now,
        )


def shoot(base: str, user: str, password: str, node: str, tenant: str = DEMO_TENANT) -> None:
    from playwright.sync_api import sync_playwright

    OUT.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        page.goto(f"{base}/admin/login/?next=/")
        page.fill("#id_username", user)
        page.fill("#id_password", password)
        page.click("input[type=submit]")
        page.wait_for_url(f"{base}/")
        page.screenshot(path=str(OUT / "cluster.png"), full_page=False)
        page.goto(f"{base}/nodes/{node}/")
        page.locator("#node-charts .chart, #node-charts .history-unavailable").first.wait_for(timeout=15_000)
        page.wait_for_timeout(500)  # let uPlot lay out after the swap
        page.screenshot(path=str(OUT / "node.png"), full_page=True)
        state = page.context.storage_state()
        phone = browser.new_page(viewport={"width": 390, "height": 844}, storage_state=state)
        phone.goto(f"{base}/")
        phone.screenshot(path=str(OUT / "cluster-phone.png"))
        phone.goto(f"{base}/nodes/{node}/")
        phone.locator("#node-charts .chart, #node-charts .history-unavailable").first.wait_for(timeout=15_000)
        phone.screenshot(path=str(OUT / "node-phone.png"))
        dark = browser.new_page(viewport={"width": 1280, "height": 900}, storage_state=state, color_scheme="dark")
        dark.goto(f"{base}/nodes/{node}/")
        dark.locator("#node-charts .chart, #node-charts .history-unavailable").first.wait_for(timeout=15_000)
        dark.wait_for_timeout(500)
        dark.screenshot(path=str(OUT / "node-dark.png"))
        saved = ["cluster.png", "node.png", "cluster-phone.png", "node-phone.png", "node-dark.png"]
        answer = page.goto(f"{base}/tenants/{tenant}/")
        if answer is not None and answer.ok:
            page.locator("#tenant-charts .chart, #tenant-charts .history-unavailable").first.wait_for(timeout=15_000)
            page.screenshot(path=str(OUT / "tenant.png"), full_page=False)
            saved.append("tenant.png")
        else:
            print(f"no tenant {tenant!r} to photograph (--tenant)", file=sys.stderr)
        browser.close()
    print(f"saved {', '.join(saved)} in {OUT}")


def demo() -> int:
    var = Path(tempfile.mkdtemp(prefix="llmgw-screenshots-"))
    stack = Stack(
        var,
        env={"REDIS_URL": f"redis://127.0.0.1:{free_port()}/0", "LLMGW_VAR_DIR": str(var)},
        web_port=free_port(),
        prometheus_port=free_port(),
        workers=2,
    )
    try:
        stack.start(stack.redis_part())
        password = stack.prepare()
        assert password is not None, "a fresh var/ gets a new admin user"
        stack.start_web()
        seed_demo_fleet(var, stack.env["REDIS_URL"])
        seed_demo_tenants()
        save_demo_loads()
        stack.start(stack.prometheus_part())
        deadline = time.monotonic() + PROMETHEUS_WARMUP
        # Loads keep arriving while Prometheus scrapes, as heartbeats would bring them.
        while time.monotonic() < deadline:
            save_demo_loads()
            time.sleep(5)
        save_demo_loads()
        seed_demo_minute()
        shoot(f"http://127.0.0.1:{stack.web_port}", "admin", password, DEMO_NODE)
    finally:
        stack.stop_all()
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", help="a running stack, e.g. http://127.0.0.1:8000 (default: start a demo stack)")
    parser.add_argument("--user", help="default: the user in var/admin-password")
    parser.add_argument("--password", help="default: the password in var/admin-password")
    parser.add_argument("--node", default=DEMO_NODE, help=f"the node to photograph (default: {DEMO_NODE})")
    parser.add_argument("--tenant", default=DEMO_TENANT, help=f"the tenant to photograph (default: {DEMO_TENANT})")
    args = parser.parse_args()
    if args.url is None:
        return demo()
    user, password = args.user, args.password
    if user is None or password is None:
        # `make run` keeps "user password" there when it creates the admin.
        kept_user, kept_password = (ROOT / "var" / "admin-password").read_text().split()
        user, password = user or kept_user, password or kept_password
    shoot(args.url.rstrip("/"), user, password, args.node, args.tenant)
    return 0


if __name__ == "__main__":
    sys.exit(main())
