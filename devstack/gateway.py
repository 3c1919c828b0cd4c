"""The gateway in the stack: HAProxy serving the OpenAI API (deploy/gateway.cfg) and the sync programming it.

HAProxy runs in master-worker mode so the sync can reload it through the master socket when a
deployment (a backend) comes or goes; both parts keep their files in one private directory.
Tests start gateways the same way (`gateway_parts`), two at once for the several-gateways case.
"""

from __future__ import annotations

import secrets
from pathlib import Path

from devstack.ports import port_open
from devstack.proxy import HAPROXY_ENV, haproxy_binary
from lib.private_files import write_private

# Clients' port for the OpenAI API, apart from the operators' pages and the agent API.
DEFAULT_PORT = 8090
# Where the gateway's sync serves its llmgw_gateway_* series (deploy/prometheus.yml's llmgw-gateway-usage job).
DEFAULT_METRICS = "127.0.0.1:9491"
# HAProxy's Prometheus exporter, on loopback: the gateway's own series (docs/gateway.md, "Observing the gateway").
METRICS_PORT = 8091
ENGINES_JOB = "  - job_name: llmgw-engines\n"


def engine_scrape_key(var: Path, env: dict[str, str]) -> None:
    """The key Prometheus sends to engines' /metrics, as a file in var/ (private from its creation) that both the
    control plane (LLMGW_ENGINE_SCRAPE_KEY_FILE) and Prometheus read; made once, unless given."""
    if env.get("LLMGW_ENGINE_SCRAPE_KEY_FILE"):
        return
    path = var / "engine-scrape-key"
    given = env.pop("LLMGW_ENGINE_SCRAPE_KEY", "")
    if given or not path.exists():
        write_private(path, given or secrets.token_urlsafe(32))
    env["LLMGW_ENGINE_SCRAPE_KEY_FILE"] = str(path)


def with_engine_scrape_key(prometheus_config: str, key_file: str) -> str:
    """deploy/prometheus.yml with the engines' job sending the scrape key, as its comment there shows."""
    if ENGINES_JOB not in prometheus_config:
        raise ValueError("deploy/prometheus.yml has no llmgw-engines job")
    authorization = f"    authorization:\n      credentials_file: {key_file}\n"
    return prometheus_config.replace(ENGINES_JOB, ENGINES_JOB + authorization, 1)


def haproxy_command(directory: Path) -> list[str]:
    # -W: master-worker (reload through the master socket); -db: stay in the foreground, logs to stdout.
    return [haproxy_binary(), "-W", "-db", "-S", str(directory / "master.sock"), "-f", str(directory / "gateway.cfg")]


def sync_command(python: str, manage: Path, directory: Path, bind: str, *extra: str) -> list[str]:
    return [python, str(manage), "gateway_sync", "--dir", str(directory), "--bind", bind, *extra]


def parts(
    stack, port: int = DEFAULT_PORT, name: str = "gateway", metrics: str | None = None, metrics_port: int | None = None
) -> list:
    """The gateway's HAProxy and sync as the stack's parts, after writing its first config (no database needed).

    With `metrics`, the sync serves its llmgw_gateway_* series (usage, budgets) there; with
    `metrics_port`, HAProxy serves its own (requests, errors, in flight) on 127.0.0.1 at that port."""
    from devstack.stack import PYTHON, ROOT, Part  # the stack imports this module: imported when used

    directory = stack.var / name
    directory.mkdir(mode=0o700, exist_ok=True)
    directory.chmod(0o700)
    bind = f"127.0.0.1:{port}"
    exporter = ("--metrics-bind", f"127.0.0.1:{metrics_port}") if metrics_port else ()
    stack.manage(*sync_command(PYTHON, ROOT / "manage.py", directory, bind, *exporter, "--render-only")[2:])
    # The sync's series for Prometheus where asked (make run: DEFAULT_METRICS); a fixed port collides between stacks.
    metrics_option = ("--metrics", metrics) if metrics else ()
    return [
        Part(name, haproxy_command(directory), ready=lambda: port_open(port), env=HAPROXY_ENV),
        Part(f"{name}-sync", sync_command(PYTHON, ROOT / "manage.py", directory, bind, *exporter, *metrics_option)),
    ]


def demo_key(stack) -> str | None:
    """The demo tenant's key, made on the first run and kept in var/demo-api-key; None when it exists already."""
    result = stack.manage("ensure_demo_key", "--key-file", str(stack.var / "demo-api-key"), capture=True)
    words = result.stdout.split()
    return words[1] if words[:1] == ["created"] else None
