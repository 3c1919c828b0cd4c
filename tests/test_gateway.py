"""The gateway end to end: a real HAProxy (deploy/gateway.cfg), programmed by the sync from the real database,
in front of real demo engines that demand their deployment's secret.

The sync's passes are called here one at a time (`Sync.run_once`), as `manage.py gateway_sync`
calls them every second: a change is in HAProxy after one pass, so within a second of the
control plane knowing it.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

from devstack import gateway as devgateway
from devstack.polling import wait_until
from devstack.ports import free_port, port_open
from gateway import haproxy_config, usage, wanted
from gateway.haproxy_config import Desired, Frontend, Paths, Peering
from gateway.models import ApiKey, Tenant
from gateway.runtime import Runtime, RuntimeError_, ask
from gateway.sync import Sync
from inventory.models import GPU, AdminState, Deployment, GPUCondition, Liveness, Node, Replica, ReplicaState, Shard
from tests import factories

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parent.parent


class Engine:
    """A demo engine process that answers only its secret, and counts what reached it."""

    def __init__(self, secret: str, cpu_ms_per_token: float = 0.1, *options: str):
        self.port = free_port()
        self.process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "agent.demo_engine",
                "--port",
                str(self.port),
                "--cpu-ms-per-token",
                str(cpu_ms_per_token),
                "--kib-per-token",
                "1",
                *options,
            ],
            env={**os.environ, "LLMGW_ENGINE_API_KEY": secret},
            cwd=ROOT,
            start_new_session=True,
        )
        wait_until(lambda: port_open(self.port), 10, "the demo engine")

    def gauge(self, name: str) -> float:
        text = requests.get(f"http://127.0.0.1:{self.port}/metrics", timeout=5).text
        return float(next(line.split()[-1] for line in text.splitlines() if line.startswith(name + "{")))

    def tokens_generated(self) -> float:
        return self.gauge("vllm:generation_tokens_total")

    def stop(self) -> None:
        os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait()


class Gateway:
    """One gateway instance: its HAProxy started as devstack starts it, and its sync."""

    def __init__(
        self,
        directory: Path,
        max_body: int = haproxy_config.MAX_BODY,
        request_timeout: int = haproxy_config.REQUEST_TIMEOUT,
        peering: Peering | None = None,
    ):
        self.port = free_port()
        self.metrics_port = free_port()
        self.paths = Paths(directory)
        self.frontend = Frontend(
            f"127.0.0.1:{self.port}", max_body, request_timeout, f"127.0.0.1:{self.metrics_port}", peering
        )
        haproxy_config.write_all(self.paths, self.frontend, Desired())
        self.sync = Sync(self.paths, self.frontend, wanted.read, record_usage=usage.record)
        self.start()

    def start(self) -> None:
        # Its log (`log stdout`) and warnings, kept for the tests that read them.
        self.output = self.paths.directory / "haproxy.out"
        with self.output.open("ab") as output:
            self.process = subprocess.Popen(
                devgateway.haproxy_command(self.paths.directory),
                env={**os.environ, **devgateway.HAPROXY_ENV},
                stdout=output,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        # An answer, not an open port: a restarted gateway's port (and its admin socket's file, left by the
        # killed one) can be there before its worker serves, and a request sent then was reset.
        wait_until(lambda: self.paths.admin_socket.exists() and self.answers(), 10, "the gateway")

    def answers(self) -> bool:
        try:
            requests.get(self.url("/v1/models"), timeout=2)
        except requests.ConnectionError:
            return False
        return True

    def stop(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def post(self, path: str, body, key: str | None, **kwargs) -> requests.Response:
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        data = body if isinstance(body, bytes | Iterator) else json.dumps(body).encode()
        return requests.post(self.url(path), data=data, headers=headers, timeout=10, **kwargs)

    def program(self):
        """One sync pass; after a reload, until the old worker has left (for a moment it still takes
        new connections, answering from the previous config)."""
        done = self.sync.run_once()
        if done.reloaded:
            wait_until(lambda: "# old workers" not in self.processes(), 10, "the old worker to leave")
        return done

    def processes(self) -> str:
        try:
            return ask(self.paths.master_socket, "show proc")
        except RuntimeError_:
            return "# old workers: unknown while the master starts again"

    def servers(self, backend: str = "m_chat") -> dict:
        return Runtime(self.paths.admin_socket).servers(backend).get(backend, {})


def serve(node_name: str, engine_port: int, served: str = "chat") -> Replica:
    """A running replica of a deployment serving `served`, its engine on this machine at `engine_port`."""
    factories.node(node_name, gpus=1)
    Node.objects.filter(pk=node_name).update(mgmt_addr="127.0.0.1", source_addr="127.0.0.1")
    replica = factories.place(f"d-{node_name}", {node_name: [0]})
    Deployment.objects.filter(pk=replica.deployment_id).update(served_model_name=served)
    Replica.objects.filter(pk=replica.pk).update(state=ReplicaState.RUNNING)
    Shard.objects.filter(replica=replica).update(state=ReplicaState.RUNNING, port=engine_port)
    return replica


@pytest.fixture
def engine(db):
    # The secret is made with the deployment; the engine is started with it, as the agent would.
    started: list[Engine] = []

    def start(deployment_name: str, cpu_ms_per_token: float = 0.1) -> Engine:
        made = Engine(Deployment.objects.get(name=deployment_name).engine_secret, cpu_ms_per_token)
        started.append(made)
        return made

    yield start
    for made in started:
        made.stop()


CHAT = {"model": "chat", "messages": [{"role": "user", "content": "Name three colours."}], "max_tokens": 4}


def one_engine(gateway: Gateway, engine, cpu_ms_per_token: float = 0.1) -> Engine:
    replica = serve("gw-1", 0)
    running = engine(replica.deployment.name, cpu_ms_per_token)
    Shard.objects.filter(replica=replica).update(port=running.port)
    gateway.program()
    return running


@pytest.mark.django_db
def test_a_request_with_a_key_reaches_the_deployments_engine_with_its_secret(gateway, engine, key):
    running = one_engine(gateway, engine)
    answer = gateway.post("/v1/chat/completions", CHAT, key)
    assert answer.status_code == 200, answer.text
    assert answer.json()["object"] == "chat.completion"
    assert len(answer.json()["choices"][0]["message"]["content"].split()) == 4
    completion = gateway.post("/v1/completions", {"model": "chat", "prompt": "hello", "max_tokens": 2}, key)
    assert completion.json()["object"] == "text_completion"
    # The engine itself refuses anyone without the deployment's secret: the gateway adds it.
    direct = requests.post(f"http://127.0.0.1:{running.port}/v1/chat/completions", json=CHAT, timeout=5)
    assert direct.status_code == 401


@pytest.mark.django_db
def test_a_stream_comes_through_event_by_event_to_done(gateway, engine, key):
    one_engine(gateway, engine)
    answer = gateway.post("/v1/chat/completions", {**CHAT, "stream": True, "max_tokens": 5}, key, stream=True)
    assert answer.status_code == 200
    assert answer.headers["Content-Type"] == "text/event-stream"
    events = [line for line in answer.iter_lines() if line]
    assert events[-1] == b"data: [DONE]"
    chunks = [json.loads(event.removeprefix(b"data: ")) for event in events[:-1]]
    assert all(chunk["object"] == "chat.completion.chunk" for chunk in chunks)
    # A token an event, then the usage the relay asked for (docs/gateway.md, "Streams").
    assert [len(chunk["choices"]) for chunk in chunks] == [1, 1, 1, 1, 1, 0]


@pytest.mark.django_db
def test_a_client_gone_mid_stream_stops_the_engines_work(gateway, engine, key):
    running = one_engine(gateway, engine, cpu_ms_per_token=5)
    answer = gateway.post(
        "/v1/completions", {"model": "chat", "prompt": "x", "max_tokens": 4096, "stream": True}, key, stream=True
    )
    lines = answer.iter_lines()
    assert next(line for line in lines if line).startswith(b"data: ")
    answer.close()
    wait_until(lambda: running.gauge("vllm:num_requests_running") == 0, 10, "the engine to stop the stream")
    made = running.tokens_generated()
    assert made < 4096
    assert gateway.post("/v1/completions", {"model": "chat", "prompt": "x", "max_tokens": 1}, key).status_code == 200
    assert running.tokens_generated() == made + 1


@pytest.mark.django_db
def test_no_wrong_revoked_or_expired_key_is_401_and_reaches_no_engine(gateway, engine, key):
    running = one_engine(gateway, engine)
    revoked = ApiKey(tenant=Tenant.objects.get(name="acme"))
    revoked_secret = revoked.issue()
    revoked.save()
    inactive = ApiKey(tenant=Tenant.objects.create(name="gone", active=False))
    inactive_secret = inactive.issue()
    inactive.save()
    gateway.sync.run_once()
    assert gateway.post("/v1/chat/completions", CHAT, revoked_secret).status_code == 200
    revoked.revoke("test")
    gateway.sync.run_once()
    before = running.tokens_generated()
    for sent in (None, "wrong", key + "x", revoked_secret, inactive_secret, key.upper()):
        answer = gateway.post("/v1/chat/completions", CHAT, sent)
        assert answer.status_code == 401, sent
        assert answer.json()["error"]["code"] == "invalid_api_key"
    assert gateway.post("/v1/chat/completions", CHAT, key).status_code == 200
    assert running.tokens_generated() == before + CHAT["max_tokens"]
    assert requests.get(gateway.url("/v1/models"), timeout=5).status_code == 401


@pytest.mark.django_db
def test_bad_requests_get_openai_shaped_errors(gateway, engine, key):
    running = one_engine(gateway, engine)
    before = running.tokens_generated()
    cases = [
        ({**CHAT, "model": "nope"}, 404, "model_not_found"),
        (b"this is not json", 400, None),
        ({"messages": []}, 400, None),
        ({**CHAT, "model": 42}, 400, None),
        ({**CHAT, "model": ["chat"]}, 400, None),
        (b'{"model": "chat", "messages": [' + b"x" * 10_000_000, 413, "request_too_large"),
    ]
    for body, status, code in cases:
        answer = gateway.post("/v1/chat/completions", body, key)
        assert answer.status_code == status, (body[:40], answer.text)
        error = answer.json()["error"]
        assert error["message"] and error["type"] == "invalid_request_error"
        assert error["code"] == code
    assert gateway.post("/v1/embeddings", CHAT, key).status_code == 404
    assert running.tokens_generated() == before  # none reached the engine


@pytest.mark.django_db
def test_the_model_routed_on_is_the_top_level_first_one(gateway, engine, key):
    # HAProxy's json_query reads the first top-level `model`; a duplicate or a nested one cannot send the
    # request to another deployment's engines (the secret added is the first model's deployment's).
    chat = one_engine(gateway, engine)
    replica = serve("gw-2", 0, served="other")
    other = engine(replica.deployment.name)
    Shard.objects.filter(replica=replica).update(port=other.port)
    gateway.program()
    messages = b'"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4'
    tool = b'"tools": [{"type": "function", "function": {"name": "pick", "parameters": {"type": "object", '
    tool += b'"properties": {"model": {"type": "string", "enum": ["chat"]}}}}}]'
    cases = [
        (b'{"model": "other", ' + messages + b', "model": "chat"}', 200, other),
        (b'{"model": "chat", ' + messages + b', "model": "other"}', 200, chat),
        (b'{"model": "nope", ' + messages + b', "model": "chat"}', 404, None),
        (b'{"metadata": {"model": "chat"}, ' + messages + b"}", 400, None),
        (b'{"model": "other", ' + tool + b", " + messages + b"}", 200, other),
    ]
    for body, status, reached in cases:
        before = {name: e.tokens_generated() for name, e in (("chat", chat), ("other", other))}
        answer = gateway.post("/v1/chat/completions", body, key)
        assert answer.status_code == status, (body, answer.text)
        after = {name: e.tokens_generated() for name, e in (("chat", chat), ("other", other))}
        assert {name: after[name] - before[name] for name in after} == {
            "chat": 4 if reached is chat else 0,
            "other": 4 if reached is other else 0,
        }, body


def send_slowly(port: int, key: str, parts: list[bytes]) -> tuple[bytes, float]:
    """`parts` sent, then nothing more: what HAProxy answers, and after how long."""
    started = time.monotonic()
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        for part in parts:
            sock.sendall(part.replace(b"KEY", key.encode()))
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    return answer, time.monotonic() - started


@pytest.mark.django_db
def test_a_client_too_slow_to_send_its_request_gets_408_and_reaches_no_engine(tmp_path, engine, key):
    slow = Gateway(tmp_path / "slow", request_timeout=1)
    try:
        running = one_engine(slow, engine)
        before = running.tokens_generated()
        body = json.dumps(CHAT).encode()
        head = b"POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\nAuthorization: Bearer KEY\r\n"
        for parts, openai_shaped in (
            # Headers that never finish: answered by HAProxy's connection layer with its own HTML page
            # (HAProxy 2.6 applies no errorfile there), before any rule has run.
            ([head], False),
            ([head + b"Content-Length: %d\r\n\r\n" % len(body), body[:20]], True),  # the body stops half way
            ([head + b"Transfer-Encoding: chunked\r\n\r\n", b"14\r\n" + body[:20] + b"\r\n"], True),
        ):
            answer, took = send_slowly(slow.port, key, parts)
            assert answer.startswith(b"HTTP/1.1 408"), (parts[-1][:40], answer[:200])
            assert (b'"type": "invalid_request_error"' in answer) == openai_shaped, answer
            assert 1 <= took < 5
        assert running.tokens_generated() == before
        assert slow.post("/v1/chat/completions", CHAT, key).status_code == 200
    finally:
        slow.stop()


@pytest.mark.django_db
def test_a_body_of_200_kb_still_routes(gateway, engine, key):
    one_engine(gateway, engine)
    answer = gateway.post("/v1/completions", {"model": "chat", "prompt": "word " * 40_000, "max_tokens": 1}, key)
    assert answer.status_code == 200, answer.text


@pytest.mark.django_db
def test_a_smaller_body_limit_is_kept_chunked_or_not(tmp_path, engine, key):
    small = Gateway(tmp_path / "small", max_body=4096)
    try:
        one_engine(small, engine)
        fits = {"model": "chat", "prompt": "w " * 1500, "max_tokens": 1}
        assert small.post("/v1/completions", fits, key).status_code == 200
        over = json.dumps({"model": "chat", "prompt": "w " * 3000}).encode()
        answer = small.post("/v1/completions", over, key)
        assert answer.status_code == 413 and "4096" in answer.json()["error"]["message"]
        # Without a length in the headers: refused once the body fills the buffer.
        chunked = small.post("/v1/completions", iter([over[:3000], over[3000:]]), key)
        assert chunked.status_code == 413, chunked.text
    finally:
        small.stop()


@pytest.mark.django_db
def test_models_lists_what_is_ready_and_a_model_without_replicas_is_503(gateway, engine, key):
    one_engine(gateway, engine)
    factories.deployment("idle", served_model_name="idle")
    assert gateway.program().reloaded
    models = requests.get(gateway.url("/v1/models"), headers={"Authorization": f"Bearer {key}"}, timeout=5).json()
    assert [m["id"] for m in models["data"]] == ["chat"]
    answer = gateway.post("/v1/chat/completions", {**CHAT, "model": "idle"}, key)
    assert answer.status_code == 503
    assert answer.headers["Retry-After"] == "1"
    assert answer.json()["error"]["code"] == "no_ready_replica"


@pytest.mark.django_db
@pytest.mark.parametrize(
    "change",
    [
        lambda: Node.objects.filter(pk="gw-1").update(admin_state=AdminState.CORDONED),
        lambda: Node.objects.filter(pk="gw-1").update(admin_state=AdminState.DRAINING),
        lambda: Node.objects.filter(pk="gw-1").update(liveness=Liveness.UNREACHABLE),
        lambda: Node.objects.filter(pk="gw-1").update(liveness=Liveness.LOST),
        lambda: GPU.objects.filter(node_id="gw-1", index=0).update(condition=GPUCondition.FAILED),
        lambda: Shard.objects.filter(node_id="gw-1").update(state=ReplicaState.FAILED),
    ],
    ids=["cordoned", "draining", "unreachable", "lost", "gpu-failed", "shard-failed"],
)
def test_a_node_or_gpu_that_must_not_serve_loses_its_server_in_one_pass(gateway, engine, key, change):
    one_engine(gateway, engine)
    assert set(gateway.servers()) == {"d-gw-1-r1"}
    change()
    done = gateway.sync.run_once()
    assert set(gateway.servers()) == set(), done
    assert gateway.post("/v1/chat/completions", CHAT, key).status_code == 503


@pytest.mark.django_db
def test_a_server_taken_out_under_a_stream_is_deleted_once_the_stream_ends(gateway, engine, key):
    one_engine(gateway, engine, cpu_ms_per_token=2)
    stream = gateway.post(
        "/v1/completions", {"model": "chat", "prompt": "x", "max_tokens": 500, "stream": True}, key, stream=True
    )
    lines = stream.iter_lines()
    assert next(line for line in lines if line).startswith(b"data: ")
    Node.objects.filter(pk="gw-1").update(admin_state=AdminState.CORDONED)
    gateway.sync.run_once()
    # Out at once (no new request reaches it), but not deleted under the stream.
    assert {name: s.state for name, s in gateway.servers().items()} == {"d-gw-1-r1": "drain"}
    refused = gateway.post("/v1/chat/completions", CHAT, key)
    assert refused.status_code == 503, refused.text
    assert [line for line in lines if line][-1] == b"data: [DONE]"
    # Deleted once HAProxy has also closed its idle connections to it (pool-purge-delay 1s).
    wait_until(lambda: gateway.sync.run_once() and gateway.servers() == {}, 10, "the server deleted", interval=0.5)


@pytest.mark.django_db
def test_the_sync_repairs_what_was_changed_behind_its_back(gateway, engine, key):
    one_engine(gateway, engine)
    runtime = Runtime(gateway.paths.admin_socket)
    runtime.command("set server m_chat/d-gw-1-r1 state maint")
    runtime.command(f"del map {gateway.paths.keys_map} {ApiKey.objects.get().digest}")
    runtime.command("add server m_chat/stray 127.0.0.1:9 weight 1", ok=("New server",))
    done = gateway.sync.run_once()
    assert {name: s.state for name, s in gateway.servers().items()} == {"d-gw-1-r1": "ready"}, done
    assert gateway.post("/v1/chat/completions", CHAT, key).status_code == 200
    # Nothing left to repair: a second pass sends nothing.
    assert gateway.sync.run_once().actions == []


@pytest.mark.django_db
def test_after_an_haproxy_restart_it_serves_the_last_state_then_converges(gateway, engine, key):
    one_engine(gateway, engine)
    # The database goes away: the last desired state stands.
    gateway.sync.read_desired = lambda: (_ for _ in ()).throw(ConnectionError("database down"))
    assert gateway.sync.run_once().errors
    gateway.stop()
    gateway.start()
    # Restarted from the files alone, it serves the key and the replica it last knew.
    assert gateway.post("/v1/chat/completions", CHAT, key).status_code == 200
    # The database back with a new key: one pass converges.
    gateway.sync.read_desired = wanted.read
    other = ApiKey(tenant=Tenant.objects.get(name="acme"))
    other_secret = other.issue()
    other.save()
    gateway.sync.run_once()
    assert gateway.post("/v1/chat/completions", CHAT, other_secret).status_code == 200
    # The server it came back with is one of its config's: taken out and deleted like any other.
    Node.objects.filter(pk="gw-1").update(admin_state=AdminState.CORDONED)
    done = gateway.sync.run_once()
    assert gateway.servers() == {}, done


@pytest.mark.django_db
def test_a_new_deployment_reloads_the_gateway_without_dropping_a_stream(gateway, engine, key):
    one_engine(gateway, engine, cpu_ms_per_token=5)
    stream = gateway.post("/v1/chat/completions", {**CHAT, "stream": True, "max_tokens": 300}, key, stream=True)
    lines = stream.iter_lines()
    assert next(line for line in lines if line).startswith(b"data: ")
    replica = serve("gw-2", 0, served="second")
    second = engine(replica.deployment.name)
    Shard.objects.filter(replica=replica).update(port=second.port)
    done = gateway.sync.run_once()
    assert done.reloaded, done
    # The old worker stays for the stream in flight; new connections go to the new one.
    assert "# old workers" in gateway.processes()

    def second_answers() -> bool:
        return gateway.post("/v1/chat/completions", {**CHAT, "model": "second"}, key).status_code == 200

    wait_until(second_answers, 5, "the new model answering")
    events = [json.loads(line.removeprefix(b"data: ")) for line in lines if line and line != b"data: [DONE]"]
    assert len([event for event in events if event["choices"]]) == 299 and "usage" in events[-1]


@pytest.mark.django_db
def test_two_gateways_are_each_programmed_and_each_answers(tmp_path, engine, key):
    gateways = [Gateway(tmp_path / "a"), Gateway(tmp_path / "b")]
    try:
        one_engine(gateways[0], engine)
        gateways[1].program()
        for each in gateways:
            assert each.post("/v1/chat/completions", CHAT, key).status_code == 200
        Node.objects.filter(pk="gw-1").update(admin_state=AdminState.CORDONED)
        for each in gateways:
            each.sync.run_once()
            assert each.servers() == {}
    finally:
        for each in gateways:
            each.stop()
