"""Drain without a dropped request, and failover.

A real HAProxy programmed by the real sync, real demo engines, the real reconciler.

The agent is played by the test through the heartbeat's own entry point (`inventory.desired.orders`):
it reports its shards, and stops an engine when its node's list no longer holds the shard, as the
agent's runner does.
"""

from __future__ import annotations

import json
import threading
import time
from datetime import timedelta

import pytest
import requests

from agent import protocol
from devstack.polling import wait_until
from gateway import usage, wanted, weights
from gateway.haproxy_config import ServerState
from gateway.sync import Sync
from inventory import desired, drainhold
from inventory.models import AdminState, Deployment, Node, Replica, ReplicaState, Shard
from inventory.models import Engine as EngineKind
from inventory.operator import set_admin_state
from inventory.reconcile import reconcile
from livestate import inflight
from tests import factories
from tests.test_gateway import CHAT, Engine, Gateway

pytestmark = pytest.mark.slow

STREAMS = 20
# Each stream lasts about 150 × 60 ms: long enough for the drain, its replacement and the release to happen under it.
SLOW = ("--max-running", "64", "--ms-between-tokens", "60")
STREAM = {**CHAT, "stream": True, "max_tokens": 150}


class Agent:
    """One node's agent, as far as the drain needs it: reports what runs, stops what its list drops."""

    def __init__(self, node_id: str):
        self.node_id = node_id
        self.engines: dict[str, Engine] = {}

    def start(self, shard: Shard, secret: str, options: tuple[str, ...] = SLOW) -> Engine:
        engine = Engine(secret, 0.1, *options)
        Shard.objects.filter(pk=shard.pk).update(port=engine.port)
        self.engines[shard.shard_id] = engine
        return engine

    def beat(self) -> set[str]:
        """One heartbeat: report, read the list, stop what it no longer holds. The shard ids still wanted."""
        reports = [protocol.ShardStatus(shard=s, state="running") for s in self.engines]
        wanted_ids = {spec.shard for spec in desired.orders(self.node_id, reports).shards}
        for shard_id in set(self.engines) - wanted_ids:
            self.engines.pop(shard_id).stop()
        return wanted_ids

    def stop_all(self) -> None:
        for engine in self.engines.values():
            if engine.process.poll() is None:  # not killed by the test already
                engine.stop()


class Stream(threading.Thread):
    """One streamed request through the gateway, read to its end."""

    def __init__(self, gateway: Gateway, key: str):
        super().__init__(daemon=True)
        self.gateway, self.key = gateway, key
        self.events: list[bytes] = []
        self.error: Exception | None = None
        self.started = threading.Event()
        self.ended_at = 0.0

    def run(self) -> None:
        try:
            answer = self.gateway.post("/v1/chat/completions", STREAM, self.key, stream=True)
            for line in answer.iter_lines():
                if line:
                    self.events.append(line)
                    self.started.set()
        except Exception as exc:  # kept for the assertion, which names it
            self.error = exc
        finally:
            self.ended_at = time.monotonic()
            self.started.set()

    def tokens(self) -> int:
        """The events that carry a token: not the usage the relay asked for (no choices), nor [DONE]."""
        return sum(b'"choices": [{' in event for event in self.events)


@pytest.fixture
def fleet(db, redis_client):
    # redis_client empties Redis: an earlier test's in-flight reports name replicas of the same names.
    for name in ("n1", "n2", "n3"):
        factories.node(name, gpus=1)
    Node.objects.update(mgmt_addr="127.0.0.1", source_addr="127.0.0.1")
    factories.deployment("chat", served_model_name="chat", engine=EngineKind.DEMO, replicas=2, gpu_class="")
    reconcile()
    agents = {name: Agent(name) for name in ("n1", "n2", "n3")}
    yield agents
    for agent in agents.values():
        agent.stop_all()


def run_on(agents: dict[str, Agent], replica: Replica, options: tuple[str, ...] = SLOW) -> Engine:
    shard = replica.shards.get()
    agent = agents[shard.node_id]
    engine = agent.start(shard, replica.deployment.engine_secret, options)
    agent.beat()
    assert Replica.objects.get(pk=replica.pk).state == ReplicaState.RUNNING
    return engine


@pytest.mark.django_db
def test_a_drained_node_finishes_its_20_streams_before_its_engine_stops(tmp_path, fleet, key, operator):
    gateway = Gateway(tmp_path / "gw")
    gateway.sync = Sync(
        gateway.paths,
        gateway.frontend,
        wanted.read,
        record_usage=usage.record,
        report_in_flight=lambda c: inflight.report("test", c),
    )
    try:
        first, second = Replica.objects.order_by("ordinal")
        assert first.shards.get().node_id != second.shards.get().node_id
        drained = first.shards.get().node_id
        run_on(fleet, first)
        gateway.sync.run_once()
        streams = [Stream(gateway, key) for _ in range(STREAMS)]
        for stream in streams:
            stream.start()
        for stream in streams:
            assert stream.started.wait(10) and not stream.error
        # All 20 on the drained node's replica; the other replica joins only now.
        other = run_on(fleet, second)
        gateway.sync.run_once()
        assert {n: s.state for n, s in gateway.servers().items()} == {
            first.replica_id: ServerState.READY,
            second.replica_id: ServerState.READY,
        }

        set_admin_state(Node.objects.get(pk=drained), AdminState.DRAINING, operator, "kernel update")
        gateway.sync.run_once()
        # At once: no new request reaches it; its streams go on.
        assert gateway.servers()[first.replica_id].state == ServerState.DRAIN
        before = other.tokens_generated()
        assert gateway.post("/v1/chat/completions", {**CHAT, "max_tokens": 3}, key).status_code == 200
        assert other.tokens_generated() == before + 3

        # The replacement is placed on the third node and runs; then the drained replica is released.
        reconcile()
        replacement = Replica.objects.get(replaces=first)
        run_on(fleet, replacement)
        reconcile()
        assert Replica.objects.get(pk=first.pk).state == ReplicaState.RELEASING

        # Its engine is held while its streams are in flight, then stopped once the last has ended.
        agent = fleet[drained]
        shard_id = first.shards.get().shard_id
        held_while_streaming = 0
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            gateway.sync.run_once()
            streaming = any(s.is_alive() for s in streams)
            still_wanted = shard_id in agent.beat()
            if not still_wanted:
                break
            held_while_streaming += streaming
            time.sleep(0.1)
        else:
            pytest.fail("the drained replica was held past its streams")
        stopped_at = time.monotonic()
        assert held_while_streaming > 0, "the streams ended before the release: nothing was held"
        for stream in streams:
            stream.join(5)
            assert stream.error is None
            assert stream.events[-1] == b"data: [DONE]"
            assert stream.tokens() == STREAM["max_tokens"]
            assert stream.ended_at <= stopped_at
        # The agent's next report says the engine stopped: the shard and its GPU go.
        agent.beat()
        assert not Shard.objects.filter(shard_id=shard_id).exists()
        wait_until(
            lambda: (
                not gateway.sync.run_once().actions
                and gateway.servers().keys() == {second.replica_id, replacement.replica_id}
            ),
            5,
            "the drained server deleted",
        )
    finally:
        gateway.stop()


def scale_down_the_newest(fleet) -> Shard:
    newest = Replica.objects.order_by("-ordinal").first()
    run_on(fleet, newest)
    Deployment.objects.filter(name="chat").update(replicas=1)
    reconcile()
    shard = newest.shards.get()
    assert shard.state == ReplicaState.RELEASING
    return shard


@pytest.mark.django_db
def test_without_a_gateway_reporting_a_released_replica_stops_at_once(fleet):
    newest = Replica.objects.order_by("-ordinal").first()
    # A gateway that stopped reporting holds nothing.
    inflight.report("gone", {newest.replica_id: 5}, now=time.time() - inflight.REPORT_MAX_AGE - 1)
    shard = scale_down_the_newest(fleet)
    assert shard.shard_id not in fleet[shard.node_id].beat()


@pytest.mark.django_db
def test_a_hold_ends_at_the_drain_deadline_with_requests_still_in_flight(fleet, settings):
    settings.LLMGW_DRAIN_DEADLINE = 30
    newest = Replica.objects.order_by("-ordinal").first()
    inflight.report("gw-a", {newest.replica_id: 2})
    inflight.report("gw-b", {newest.replica_id: 1, "other": 4})
    assert inflight.read()[newest.replica_id] == 3
    shard = scale_down_the_newest(fleet)
    assert shard.shard_id in fleet[shard.node_id].beat()
    assert drainhold.held([shard], now=shard.changed_at + timedelta(seconds=29)) == {shard.shard_id}
    assert drainhold.held([shard], now=shard.changed_at + timedelta(seconds=31)) == set()


def two_replicas_running(fleet, tmp_path, options: tuple[str, ...] = SLOW) -> tuple[Gateway, list[Engine]]:
    gateway = Gateway(tmp_path / "gw")
    engines = [run_on(fleet, replica, options) for replica in Replica.objects.order_by("ordinal")]
    gateway.sync.run_once()
    assert len(gateway.servers()) == 2
    return gateway, engines


def post_all(gateway: Gateway, key: str, body: dict, count: int) -> tuple[list, list[threading.Thread]]:
    """`count` requests at once; each one's status code, or the exception it raised."""
    results: list = [None] * count

    def one(i: int) -> None:
        try:
            results[i] = gateway.post("/v1/chat/completions", body, key).status_code
        except Exception as exc:  # kept for the assertion, which names it
            results[i] = exc

    threads = [threading.Thread(target=one, args=(i,), daemon=True) for i in range(count)]
    for thread in threads:
        thread.start()
    return results, threads


@pytest.mark.django_db
def test_an_engine_killed_under_load_costs_no_request_that_had_not_started_answering(tmp_path, fleet, key):
    gateway, (doomed, survivor) = two_replicas_running(fleet, tmp_path)
    try:
        # Each answer takes about 20 × 60 ms; the kill comes while both engines hold requests.
        body = {**CHAT, "max_tokens": 20}
        results, threads = post_all(gateway, key, body, 40)
        wait_until(lambda: doomed.gauge("vllm:num_requests_running") >= 5, 10, "requests on the doomed engine")
        doomed.stop()
        for thread in threads:
            thread.join(30)
        assert results == [200] * 40
        assert survivor.gauge("vllm:num_requests_running") == 0
    finally:
        gateway.stop()


@pytest.mark.django_db
def test_a_stream_cut_mid_way_ends_with_an_error_event_for_its_client_never_hangs(tmp_path, fleet, key):
    gateway, (doomed, _) = two_replicas_running(fleet, tmp_path)
    try:
        streams = [Stream(gateway, key) for _ in range(4)]
        for stream in streams:
            stream.start()
        for stream in streams:
            assert stream.started.wait(10)
        wait_until(lambda: doomed.gauge("vllm:num_requests_running") >= 1, 10, "a stream on the doomed engine")
        killed_at = time.monotonic()
        doomed.stop()
        for stream in streams:
            stream.join(10)
            assert not stream.is_alive(), "a cut stream hangs"
        cut = [s for s in streams if s.events[-1] != b"data: [DONE]"]
        assert cut, "no stream was on the killed engine"
        for stream in cut:
            # Ended by the relay within a second of the kill, not by a timeout: an error event, then
            # the response's end (tests/test_gateway_relay.py reads its framing byte by byte).
            assert stream.ended_at - killed_at < 1.0
            assert stream.error is None
            assert json.loads(stream.events[-1].removeprefix(b"data: "))["error"]["code"] == "upstream_disconnected"
        for stream in set(streams) - set(cut):
            assert stream.error is None and stream.tokens() == STREAM["max_tokens"]
    finally:
        gateway.stop()


@pytest.mark.django_db
def test_a_servers_weight_follows_its_engines_queue(tmp_path, fleet):
    # One slot each: a fourth request waits behind three.
    gateway, (busy, _) = two_replicas_running(fleet, tmp_path, ("--max-running", "1", "--ms-between-tokens", "60"))
    gateway.sync.read_queues = weights.queues
    try:
        first, second = Replica.objects.order_by("ordinal")
        weights_now = lambda: {name: s.weight for name, s in gateway.servers().items()}  # noqa: E731
        gateway.sync.run_once()
        assert weights_now() == {first.replica_id: 100, second.replica_id: 100}
        # Straight to the engine, as another gateway's requests would come: one runs, three wait for its slot.
        secret = first.deployment.engine_secret
        direct = [
            threading.Thread(
                target=requests.post,
                args=(f"http://127.0.0.1:{busy.port}/v1/completions",),
                kwargs={
                    "json": {"prompt": "x", "max_tokens": 30},
                    "headers": {"Authorization": f"Bearer {secret}"},
                    "timeout": 30,
                },
                daemon=True,
            )
            for _ in range(4)
        ]
        for thread in direct:
            thread.start()
        wait_until(lambda: busy.gauge("vllm:num_requests_waiting") == 3, 10, "three requests queued")
        done = gateway.sync.run_once()
        assert weights_now() == {first.replica_id: 12, second.replica_id: 100}, done
        assert f"set server m_chat/{first.replica_id} weight 12" in done.actions
        # Unchanged queue, nothing sent; the queue gone, the full weight back.
        assert gateway.sync.run_once().actions == []
        for thread in direct:
            thread.join(30)
        gateway.sync.run_once()
        assert weights_now() == {first.replica_id: 100, second.replica_id: 100}
    finally:
        gateway.stop()


def test_the_weight_halves_with_each_request_waiting():
    assert [weights.weight(n) for n in (0, 1, 2, 3, 6, 7, 1000)] == [100, 50, 25, 12, 1, 1, 1]
    llama = "llamacpp:requests_deferred 2\nllamacpp:requests_processing 4\n"
    sglang = 'sglang:num_queue_reqs{model_name="m"} 1.0\n'
    assert weights.queue_depth(llama) == 2
    assert weights.queue_depth(sglang) == 1
    assert weights.queue_depth("other_metric 3\n") is None


@pytest.mark.django_db
def test_prefix_affinity_sends_requests_that_start_alike_to_one_replica(tmp_path, fleet, key):
    Deployment.objects.filter(name="chat").update(prefix_affinity=True)
    gateway, engines = two_replicas_running(fleet, tmp_path, ("--max-running", "4"))
    try:
        assert "hash-balance-factor 125" in gateway.paths.config.read_text()

        def tokens_per_engine(prompts: list[str], stream: bool = False) -> list[float]:
            before = [e.tokens_generated() for e in engines]
            for prompt in prompts:
                body = {"model": "chat", "messages": [{"role": "user", "content": prompt}], "max_tokens": 1}
                answer = gateway.post("/v1/chat/completions", {**body, "stream": stream}, key)
                assert answer.status_code == 200
                assert answer.text.endswith("data: [DONE]\n\n") == stream
            return [e.tokens_generated() - b for e, b in zip(engines, before, strict=True)]

        # Alike: one replica takes all ten; different starts spread over both. Streams too, which
        # reach the backend by the relay's internal hop: its hash sees the body as the public one does.
        alike = ["You are a helpful assistant. Name a colour."] * 10
        assert sorted(tokens_per_engine(alike)) == [0, 10]
        assert sorted(tokens_per_engine(alike, stream=True)) == [0, 10]
        assert min(tokens_per_engine([f"Question {i}: name a colour." for i in range(20)])) > 0
        assert min(tokens_per_engine([f"Question {i}: name a colour." for i in range(20)], stream=True)) > 0
    finally:
        gateway.stop()
