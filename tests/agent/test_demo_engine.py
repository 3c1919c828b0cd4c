"""The demo engine over real HTTP: completions, vLLM-named gauges, and refusals of bad input."""

import subprocess
import sys
import threading
from pathlib import Path

import pytest
import requests

from devstack.polling import wait_until
from devstack.ports import free_port, port_open

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def engine():
    port = free_port()
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "agent.demo_engine",
            "--port",
            str(port),
            "--max-running",
            "1",
            "--cpu-ms-per-token",
            "20",
            # As a deployment starts it: the weights' path, and the name clients call it by.
            "--model",
            "/models/weights.bin",
            "--served-model-name",
            "chat",
        ],
        cwd=ROOT,
    )
    wait_until(lambda: port_open(port), 15, "the demo engine")
    yield f"http://127.0.0.1:{port}"
    process.terminate()
    process.wait(10)


def gauges(base: str) -> dict[str, float]:
    values = {}
    for line in requests.get(f"{base}/metrics", timeout=5).text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            values[name.split("{")[0]] = float(value)
    return values


def test_completion_in_the_openai_shape(engine):
    reply = requests.post(f"{engine}/v1/completions", json={"prompt": "hello there", "max_tokens": 5}, timeout=10)
    assert reply.status_code == 200
    body = reply.json()
    assert body["object"] == "text_completion"
    assert body["model"] == "chat"
    assert len(body["choices"][0]["text"].split()) == 5
    assert body["usage"] == {"prompt_tokens": 2, "completion_tokens": 5, "total_tokens": 7}


def test_gauges_count_running_and_waiting_requests(engine):
    assert {"vllm:num_requests_running", "vllm:num_requests_waiting"} <= set(gauges(engine))
    # One slot, three long requests: one runs, two wait.
    threads = [
        threading.Thread(
            target=requests.post, args=(f"{engine}/v1/completions",), kwargs={"json": {"max_tokens": 20}, "timeout": 30}
        )
        for _ in range(3)
    ]
    for thread in threads:
        thread.start()
    wait_until(lambda: gauges(engine)["vllm:num_requests_waiting"] == 2, 10, "two waiting requests")
    assert gauges(engine)["vllm:num_requests_running"] == 1
    for thread in threads:
        thread.join(30)
    assert gauges(engine)["vllm:num_requests_running"] == 0
    assert gauges(engine)["vllm:generation_tokens_total"] >= 60


@pytest.mark.parametrize(
    "body",
    [b"not json", b'{"max_tokens": 0}', b'{"max_tokens": "many"}', b'{"prompt": 5}', b'{"max_tokens": 100000}', b"[]"],
)
def test_bad_requests_get_400(engine, body):
    reply = requests.post(f"{engine}/v1/completions", data=body, timeout=10)
    assert reply.status_code == 400
    assert "message" in reply.json()["error"]


def test_unknown_paths_get_404(engine):
    assert requests.get(f"{engine}/nope", timeout=5).status_code == 404
    assert requests.post(f"{engine}/v1/chat", json={}, timeout=5).status_code == 404
