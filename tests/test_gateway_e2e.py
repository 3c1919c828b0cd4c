"""End to end, as `make run` starts it: the agent runs the demo engines with their deployment's secret, the
gateway's sync (its own process) programs HAProxy, and the demo tenant's key gets answers through it, also
after HAProxy is killed and started again."""

from __future__ import annotations

import signal
import socket

import pytest
import requests

import livestate
from devstack import gateway
from devstack.polling import wait_until
from devstack.ports import free_port, port_open
from devstack.stack import Stack
from inventory.placement import FIRST_ENGINE_PORT
from livestate import keys

pytestmark = pytest.mark.slow


def test_the_demo_answers_through_the_gateway_with_the_demo_key(tmp_path, redis_server):
    # Placement gives a machine's first engines these ports; another stack's engines on them would answer instead.
    if port_open(FIRST_ENGINE_PORT) or port_open(FIRST_ENGINE_PORT + 1):
        pytest.skip(f"another stack's engines hold ports {FIRST_ENGINE_PORT}-{FIRST_ENGINE_PORT + 1} on this machine")
    redis_url = redis_server if isinstance(redis_server, str) else redis_server.url
    stack = Stack(
        tmp_path,
        env={
            "DATABASE_URL": f"sqlite:///{tmp_path / 'llmgw.sqlite3'}",
            "REDIS_URL": redis_url,
            "LLMGW_BEAT_PERIOD": "1",
            "LLMGW_HEARTBEAT_INTERVAL": "1",
        },
        web_port=free_port(),
        prometheus_port=free_port(),
        workers=2,
    )
    port = free_port()
    url = f"http://127.0.0.1:{port}/v1"
    try:
        stack.manage("migrate", "--noinput", "-v0")
        stack.start_web()
        stack.start(stack.celery_part())
        base = f"http://127.0.0.1:{stack.web_port}"
        stack.manage("setup_demo", "--var-dir", str(tmp_path), "--control-plane", base, "--no-real-model", capture=True)
        stack.start(stack.agent_part())
        for part in gateway.parts(stack, port=port):
            stack.start(part)
        key = gateway.demo_key(stack)
        assert key is not None and (tmp_path / "demo-api-key").read_text() == key
        assert gateway.demo_key(stack) is None
        auth = {"Authorization": f"Bearer {key}"}
        question = {"model": "demo", "messages": [{"role": "user", "content": "Name three colours."}]}

        def answered() -> bool:
            reply = requests.post(f"{url}/chat/completions", json=question, headers=auth, timeout=10)
            return reply.status_code == 200 and reply.json()["object"] == "chat.completion"

        wait_until(answered, 120, "the demo answering through the gateway")
        models = requests.get(f"{url}/models", headers=auth, timeout=5).json()
        assert [m["id"] for m in models["data"]] == ["demo"]
        assert requests.post(f"{url}/chat/completions", json=question, timeout=5).status_code == 401
        # The sync reports its requests in flight each pass, under its host name and address (drains wait on them).
        reported = f"{socket.gethostname()} 127.0.0.1:{port}"
        wait_until(lambda: livestate.client().hexists(keys.GATEWAY_IN_FLIGHT, reported), 5, "the in-flight report")

        # HAProxy killed and started again: it comes back from its files, and the sync keeps it right.
        stack.stop("gateway", sig=signal.SIGKILL)
        stack.start(gateway.parts(stack, port=port)[0])
        wait_until(answered, 10, "the gateway answering after its restart")
    finally:
        stack.stop_all()
