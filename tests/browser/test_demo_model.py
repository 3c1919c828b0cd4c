"""The real demo, as `make run` starts it: SmolLM2-135M-Instruct fetched in the background, llama.cpp installed
by the agent (from the shared cache here; docs/engines.md has the cold build's time), the replica running, the
README's question answered rightly through the gateway with the demo tenant's key (the engine itself, at the
endpoint the node page shows, answers only the gateway), and the node page in Chromium showing the engine's
cores above zero while it answers."""

from __future__ import annotations

import json
import re
import sqlite3
import threading
import urllib.request

import pytest

from devstack import gateway
from devstack.polling import wait_until
from devstack.ports import free_port
from devstack.stack import Stack
from tests.browser.conftest import log_in

pytestmark = [pytest.mark.browser, pytest.mark.slow]

# A cold llama.cpp build on two busy cores took 33 minutes here; a warm cache, seconds.
INSTALL_TIMEOUT = 45 * 60
PASSWORD = "demo-pass-model"


def ask(gateway: str, key: str, question: str, max_tokens: int, **extra) -> dict:
    """What the README's curl does: through the gateway with a key, at temperature 0, so the answer is the same
    on every run."""
    payload = {
        "model": "smollm2",
        "messages": [{"role": "user", "content": question}],
        "max_tokens": max_tokens,
        "temperature": 0,
    }
    body = json.dumps({**payload, **extra}).encode()
    headers = {"Content-Type": "application/json", "Authorization": f"Bearer {key}"}
    request = urllib.request.Request(f"{gateway}/chat/completions", body, headers, method="POST")
    with urllib.request.urlopen(request, timeout=900) as response:
        return json.load(response)


def served(gateway: str, key: str) -> list[str]:
    """The models the gateway lists as ready (GET /v1/models)."""
    request = urllib.request.Request(f"{gateway}/models", headers={"Authorization": f"Bearer {key}"})
    with urllib.request.urlopen(request, timeout=10) as response:
        return [model["id"] for model in json.load(response)["data"]]


def test_make_run_serves_a_model_that_answers_and_the_node_page_shows_it_working(tmp_path, redis_server, page):
    redis_url = redis_server if isinstance(redis_server, str) else redis_server.url
    database = tmp_path / "llmgw.sqlite3"
    stack = Stack(
        tmp_path,
        env={
            "DATABASE_URL": f"sqlite:///{database}",
            "REDIS_URL": redis_url,
            "LLMGW_BEAT_PERIOD": "1",
            "LLMGW_HEARTBEAT_INTERVAL": "1",
        },
        web_port=free_port(),
        prometheus_port=free_port(),
        workers=2,
    )
    base = f"http://127.0.0.1:{stack.web_port}"

    def replica() -> tuple[str, str, str, int] | None:
        """(replica state, shard id, node, port) of the real model's replica."""
        with sqlite3.connect(f"file:{database}?mode=ro", uri=True) as db:
            return db.execute(
                "SELECT r.state, s.shard_id, s.node_id, s.port FROM inventory_replica r "
                "JOIN inventory_deployment d ON r.deployment_id = d.id "
                "LEFT JOIN inventory_shard s ON s.replica_id = r.id WHERE d.name = 'smollm2'"
            ).fetchone()

    try:
        stack.manage("migrate", "--noinput", "-v0")
        stack.manage("ensure_admin", "--password-stdin", stdin=f"{PASSWORD}\n", capture=True)
        stack.start_web()
        stack.start(stack.celery_part())
        gateway_port = free_port()
        for part in gateway.parts(stack, port=gateway_port):
            stack.start(part)
        key = gateway.demo_key(stack)
        assert key is not None
        through_gateway = f"http://127.0.0.1:{gateway_port}/v1"
        stack.manage("setup_demo", "--var-dir", str(tmp_path), "--control-plane", base, capture=True)
        stack.fetch_demo_model()
        stack.start(stack.agent_part())

        def running() -> bool:
            # An engine that dies is restarted by the agent; the test fails at its first death instead of
            # waiting out the build's timeout for a replica that will never run.
            crashed = [line for line in agent_log().splitlines() if "killed by signal" in line]
            assert not crashed, crashed[0]
            return (replica() or ("",))[0] == "running"

        def agent_log() -> str:
            path = stack.logs / "agent.log"
            return path.read_text(errors="replace") if path.exists() else ""

        wait_until(running, INSTALL_TIMEOUT, "the model's replica running")
        _, shard_id, node_id, _ = replica()

        log_in(page, base, "admin", PASSWORD, f"/nodes/{node_id}/")
        row = page.locator("#node-live tr", has=page.locator(f"code:text-is('{shard_id}')"))
        endpoint = row.locator("td.endpoint code").inner_text()
        assert re.fullmatch(r"http://[^:/]+:\d+/v1", endpoint), endpoint
        assert page.locator("li[data-install-state='ready']").count() == 1

        # The gateway's sync takes the running replica in within a second or so.
        wait_until(lambda: "smollm2" in served(through_gateway, key), 30, "the gateway listing the model")
        # The README's question: an instruction-tuned model answers it, and rightly.
        answer = ask(through_gateway, key, "What is the capital of France?", 32)
        assert "Paris" in answer["choices"][0]["message"]["content"], answer

        # The model answers fast, so it is kept busy until the page has shown it working: one long
        # answer after another (ignore_eos: llama-server writes every token asked for).
        answers: list[dict] = []
        seen = threading.Event()

        def keep_asking() -> None:
            while not seen.is_set():
                answers.append(ask(through_gateway, key, "Count from one to a hundred.", 200, ignore_eos=True))

        asking = threading.Thread(target=keep_asking)
        asking.start()

        def cores_while_answering() -> bool:
            # The live region refreshes itself every 5 s; read the row as it stands.
            cells = row.locator("td.numeric").all_inner_texts()
            return bool(cells) and cells[0] not in ("—", "") and float(cells[0]) > 0 and asking.is_alive()

        try:
            wait_until(
                cores_while_answering, 120, "the node page showing the engine's cores above zero while it answers"
            )
        finally:
            seen.set()
            asking.join(900)
        assert answers and all(a["usage"]["completion_tokens"] > 0 for a in answers)
    finally:
        try:
            # The page stops refreshing before the stack stops: a refresh the stop cuts mid-way
            # (htmx:sendError) is the test's doing, not the page's error.
            page.goto("about:blank")
        finally:
            stack.stop_all()
