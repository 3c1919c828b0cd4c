"""`make run`: start the whole stack on this machine, say where to look, and stop it all on Ctrl-C."""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

from devstack import gateway, tls
from devstack.stack import ROOT, Stack

HTTPS_PORT = 8443


def main() -> int:
    var = Path(os.environ.get("LLMGW_VAR_DIR", ROOT / "var"))
    # HTTPS for clients, with a CA made under var/tls/; plain HTTP on loopback only. LLMGW_DEV_HTTPS_HOST=0.0.0.0
    # lets agents on other machines in (they trust var/tls/ca.pem by its file).
    stack = Stack(
        var, https_port=HTTPS_PORT, https_host=os.environ.get("LLMGW_DEV_HTTPS_HOST", "127.0.0.1"), redis_password=True
    )
    base = f"https://127.0.0.1:{HTTPS_PORT}"
    stopping = False

    def on_signal(signum: int, frame: object) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    try:
        redis = stack.redis_part()
        stack.start(redis)
        password = stack.prepare()
        stack.start_web()
        stack.start(stack.celery_part())
        stack.start(stack.prometheus_part())
        ca = str(tls.ensure(var).ca)
        stack.manage("setup_demo", "--var-dir", str(var), "--control-plane", base, "--ca-file", ca, capture=True)
        stack.fetch_demo_model()
        stack.start(stack.agent_part())
        for part in gateway.parts(stack, metrics=gateway.DEFAULT_METRICS, metrics_port=gateway.METRICS_PORT):
            stack.start(part)
        demo_key = gateway.demo_key(stack)
    except Exception as exc:
        print(f"llmgw: could not start: {exc}", file=sys.stderr)
        stack.stop_all()
        return 1

    plain = f"http://127.0.0.1:{stack.web_port}"
    print()
    print("llmgw is running:")
    print(f"  cluster page   {base}/   (plain HTTP on loopback only: {plain}/)")
    print(f"  admin          {base}/admin/")
    print(f"  fleet metrics  {base}/metrics")
    print(f"  certificates   made by the stack's own CA, {tls.ensure(var).ca}: trust it (the agent does, by file)")
    backends = ", ".join(f"127.0.0.1:{b.port}" for b in stack.backends)
    print(f"  proxy          HAProxy at {base} and {plain}, before granian at {backends} ({stack.var / 'haproxy.cfg'})")
    print(f"  gateway        http://127.0.0.1:{gateway.DEFAULT_PORT}/v1 (OpenAI API; HAProxy, {stack.var / 'gateway'})")
    print(f"  gateway series http://127.0.0.1:{gateway.METRICS_PORT}/metrics (HAProxy's exporter, for Prometheus)")
    if "prometheus" in stack.parts:
        print(f"  prometheus     http://127.0.0.1:{stack.prometheus_port}/")
    if redis:
        print(f"  redis          started here, with the password in {var / 'redis-password'} (REDIS_URL carries it)")
    else:
        print(f"  redis          {stack.env['REDIS_URL']}, already running: used as it is, WITHOUT a password")
    print(f"  logs           {stack.logs}/")
    print("  demo model     SmolLM2-135M-Instruct on llama.cpp, fetched and built in the background: the node page")
    print("                 shows the install, then the engine and its endpoint (README: asking it a question)")
    if password:
        print(f"  admin user     admin / {password}   (shown once; kept in {var / 'admin-password'})")
    else:
        print("  admin user     exists already (password in var/admin-password if make run created it)")
    if demo_key:
        print(f"  API key        {demo_key}   (tenant demo; shown once; kept in {var / 'demo-api-key'})")
    else:
        print(f"  API key        exists already (in {var / 'demo-api-key'})")
    print("Ctrl-C stops everything.")
    sys.stdout.flush()
    while not stopping:
        for part in stack.parts.values():
            if part.process is not None and part.process.poll() is not None:
                print(
                    f"llmgw: {part.name} exited with {part.process.returncode}; see {stack.logs / part.name}.log",
                    file=sys.stderr,
                )
                stopping = True
        time.sleep(0.5)
    print("\nstopping…")
    stack.stop_all()
    return 0


if __name__ == "__main__":
    sys.exit(main())
