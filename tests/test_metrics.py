"""/metrics: fresh loads with their exact values, the inventory, the control plane's own counters."""

from __future__ import annotations

import time

import pytest
import time_machine
from django.db import connection
from django.test import Client

from agent import protocol
from devstack.faults import redis_unreachable
from inventory.models import Filesystem, Node
from livestate import keys, loadstore, selfmetrics
from tests.factories import make_inventory, place
from tests.metrics_scrape import TEXT, body, named, of, samples

pytestmark = pytest.mark.django_db

T0 = 1_900_000_000.0


def scrape(client: Client, **headers) -> dict:
    response = client.get("/metrics", headers={"Accept": TEXT, **headers})
    assert response.status_code == 200
    return samples(body(response))


def a_load(**overrides) -> protocol.Load:
    values = dict(
        cpu_percent=37.5,
        cpus=192,
        load1=12.25,
        load5=10.5,
        load15=8.75,
        memory_used_bytes=123 * 2**30,
        memory_available_bytes=389 * 2**30,
        interval_seconds=5.0,
        shards=[protocol.ShardLoad(shard="llama-r1-s0", cpu_cores=2.75, rss_bytes=7 * 2**30)],
    )
    return protocol.Load(**{**values, **overrides})


@pytest.fixture
def placed(cluster):
    """ready-1 holds shard llama-r1-s0 of replica llama-r1 on GPUs 0 and 1, placed as reconcile places."""
    place("llama", {"ready-1": [0, 1]}, memory_gb=64, model="meta-llama/Llama-3.1-8B")
    return cluster


def test_a_fresh_load_is_exported_with_its_exact_values(client, placed, redis_client):
    loadstore.save("ready-1", a_load(), received_at=T0)
    with time_machine.travel(T0 + 1, tick=False):
        found = scrape(client)
    node = {"node": "ready-1"}
    assert of(found, "llmgw_node_cpu_utilization_percent", **node) == 37.5
    assert of(found, "llmgw_node_cpus", **node) == 192
    assert named(found, "llmgw_node_load") == {
        frozenset({**node, "window": "1m"}.items()): 12.25,
        frozenset({**node, "window": "5m"}.items()): 10.5,
        frozenset({**node, "window": "15m"}.items()): 8.75,
    }
    assert of(found, "llmgw_node_memory_used_bytes", **node) == 123 * 2**30
    assert of(found, "llmgw_node_memory_available_bytes", **node) == 389 * 2**30
    shard = {
        **node,
        "shard": "llama-r1-s0",
        "replica": "llama-r1",
        "model": "meta-llama/Llama-3.1-8B",
        "served_model": "llama",
    }
    assert of(found, "llmgw_shard_cpu_cores", **shard) == 2.75
    assert of(found, "llmgw_shard_memory_bytes", **shard) == 7 * 2**30
    # Only ready-1 sent a load.
    assert len(named(found, "llmgw_node_cpus")) == 1


def test_a_load_older_than_the_limit_is_left_out_and_the_inventory_stays(client, placed, redis_client, settings):
    settings.LLMGW_LOAD_MAX_AGE = 60
    loadstore.save("ready-1", a_load(), received_at=T0)
    with time_machine.travel(T0 + 60, tick=False):
        assert of(scrape(client), "llmgw_node_cpus", node="ready-1") == 192
    with time_machine.travel(T0 + 61, tick=False):
        found = scrape(client)
    for name in ("llmgw_node_cpu_utilization_percent", "llmgw_node_cpus", "llmgw_node_load", "llmgw_shard_cpu_cores"):
        assert named(found, name) == {}, name
    assert of(found, "llmgw_node_memory_bytes", node="ready-1") == 512 * 2**30
    assert of(found, "llmgw_node_state", node="ready-1", state="ready") == 1
    assert (
        of(
            found,
            "llmgw_shard_allocated_gpus",
            node="ready-1",
            shard="llama-r1-s0",
            replica="llama-r1",
            model="meta-llama/Llama-3.1-8B",
            served_model="llama",
        )
        == 2
    )


def test_a_node_deleted_from_the_inventory_disappears_even_with_a_fresh_load(client, placed, redis_client):
    loadstore.save("ready-1", a_load(), received_at=T0)
    loadstore.save("lost-1", a_load(shards=[]), received_at=T0)
    with time_machine.travel(T0 + 1, tick=False):
        assert {dict(labels)["node"] for labels in named(scrape(client), "llmgw_node_cpus")} == {"ready-1", "lost-1"}
        Node.objects.filter(pk="ready-1").delete()
        found = scrape(client)
    assert not [key for key in found if ("node", "ready-1") in key[1]]
    assert {dict(labels)["node"] for labels in named(found, "llmgw_node_cpus")} == {"lost-1"}


def test_the_inventory_is_exported_for_every_node(client, placed, redis_client):
    Filesystem.objects.create(node_id="ready-1", mount="/models", total_bytes=1000, free_bytes=400)
    Filesystem.objects.create(node_id="ready-1", mount="/filer", total_bytes=10**9, free_bytes=10**8, shared=True)
    found = scrape(client)
    assert {dict(labels)["node"]: dict(labels)["state"] for labels in named(found, "llmgw_node_state")} == {
        "ready-1": "ready",
        "cordoned-1": "cordoned",
        "unreachable-1": "unreachable",
        "lost-1": "lost",
    }
    ready = placed["ready-1"]
    assert of(found, "llmgw_node_last_heartbeat_timestamp_seconds", node="ready-1") == ready.last_heartbeat.timestamp()
    gpu = {"node": "ready-1", "class": "H100-80GB"}
    assert of(found, "llmgw_node_gpus", **gpu) == 8
    assert of(found, "llmgw_node_gpus_free", **gpu) == 6
    assert of(found, "llmgw_node_gpus_free", node="cordoned-1", **{"class": "H100-80GB"}) == 8
    assert of(found, "llmgw_node_gpu_memory_bytes", **gpu) == 8 * 80 * 2**30
    # Shared filesystems are everyone's: only the local one counts; no filesystem reported is no series.
    assert of(found, "llmgw_node_local_disk_free_bytes", node="ready-1") == 400
    assert of(found, "llmgw_node_local_disk_size_bytes", node="ready-1") == 1000
    assert of(found, "llmgw_node_local_disk_size_bytes", node="lost-1") is None
    assert (
        of(
            found,
            "llmgw_node_info",
            node="ready-1",
            hostname="ready-1.example",
            agent_version="0.1.0",
            os="Debian GNU/Linux",
            os_version="12",
            kernel="6.1.0",
            arch="x86_64",
            cpu_model="AMD EPYC 9654",
        )
        == 1
    )
    shard = {
        "node": "ready-1",
        "shard": "llama-r1-s0",
        "replica": "llama-r1",
        "model": "meta-llama/Llama-3.1-8B",
        "served_model": "llama",
    }
    assert of(found, "llmgw_shard_memory_claim_bytes", **shard) == 64 * 2**30
    assert of(found, "llmgw_loadstore_up") == 1


def test_an_unhealthy_gpu_is_never_free(client, placed, redis_client):
    placed["cordoned-1"].gpus.filter(index=3).update(health="ECC errors")
    found = scrape(client)
    assert of(found, "llmgw_node_gpus_free", node="cordoned-1", **{"class": "H100-80GB"}) == 7


def test_a_shard_running_without_an_allocation_is_not_exported(client, cluster, redis_client):
    # Its name is only the agent's word: each new one would be a new series (issue 22; the node page lists it).
    loadstore.save("ready-1", a_load(shards=[protocol.ShardLoad(shard="orphan", cpu_cores=1.0)]), time.time())
    found = scrape(client)
    assert named(found, "llmgw_shard_cpu_cores") == {}


def test_label_values_are_escaped(client, db, redis_client):
    from inventory.registration import upsert_inventory

    upsert_inventory("odd", make_inventory('host "quoted" \\ back\nslash'))
    found = scrape(client)
    info = named(found, "llmgw_node_info")
    assert [dict(labels)["hostname"] for labels in info] == ['host "quoted" \\ back\nslash']


def test_the_control_planes_own_counters(client, db, redis_client):
    selfmetrics.record(selfmetrics.heartbeat_fields("accepted", 0.003))
    selfmetrics.record(selfmetrics.heartbeat_fields("accepted", 0.3))
    selfmetrics.record(selfmetrics.heartbeat_fields("bad_token", 0.0005))
    selfmetrics.record(selfmetrics.sweep_fields(unreachable=2, lost=1, failed=0))
    selfmetrics.record(selfmetrics.sweep_fields(unreachable=0, lost=0, failed=0, held_back=True))
    selfmetrics.record(selfmetrics.sweep_fields(unreachable=0, lost=0, failed=0, graced=True))
    found = scrape(client)
    assert of(found, "llmgw_heartbeats_accepted_total") == 2
    assert of(found, "llmgw_heartbeats_rejected_total", reason="bad_token") == 1
    assert of(found, "llmgw_heartbeat_handling_seconds_count") == 3
    assert of(found, "llmgw_heartbeat_handling_seconds_sum") == pytest.approx(0.3035)
    assert of(found, "llmgw_heartbeat_handling_seconds_bucket", le="0.001") == 1
    assert of(found, "llmgw_heartbeat_handling_seconds_bucket", le="0.005") == 2
    assert of(found, "llmgw_heartbeat_handling_seconds_bucket", le="0.25") == 2
    assert of(found, "llmgw_heartbeat_handling_seconds_bucket", le="0.5") == 3
    assert of(found, "llmgw_heartbeat_handling_seconds_bucket", le="+Inf") == 3
    assert of(found, "llmgw_stale_sweeps_total") == 3
    assert of(found, "llmgw_stale_nodes_marked_total", liveness="unreachable") == 2
    assert of(found, "llmgw_stale_nodes_marked_total", liveness="lost") == 1
    assert of(found, "llmgw_stale_sweeps_held_total") == 1
    assert of(found, "llmgw_stale_sweeps_graced_total") == 1


def test_heartbeats_waits_in_the_proxy_and_the_proxies_clocks(client, db, redis_client):
    selfmetrics.record(selfmetrics.heartbeat_fields("accepted", 0.003, waited=0.0004))
    selfmetrics.record(selfmetrics.heartbeat_fields("accepted", 0.003, waited=1.7))
    selfmetrics.record(selfmetrics.heartbeat_fields("accepted", 0.003))  # no proxy in front: no wait known
    now = time.time()
    selfmetrics.record_proxy_clock("lb-1", "web-a", 0.002, now)
    selfmetrics.record_proxy_clock("lb-2", "web-a", -3.25, now)
    selfmetrics.record_proxy_clock("lb-gone", "web-a", 9.0, now - 3600)
    found = scrape(client)
    assert of(found, "llmgw_heartbeat_proxy_wait_seconds_count") == 2
    assert of(found, "llmgw_heartbeat_proxy_wait_seconds_sum") == pytest.approx(1.7004)
    assert of(found, "llmgw_heartbeat_proxy_wait_seconds_bucket", le="0.001") == 1
    assert of(found, "llmgw_heartbeat_proxy_wait_seconds_bucket", le="1.0") == 1
    assert of(found, "llmgw_heartbeat_proxy_wait_seconds_bucket", le="2.5") == 2
    assert named(found, "llmgw_proxy_clock_offset_seconds") == {
        frozenset({("proxy", "lb-1"), ("web_host", "web-a")}): 0.002,
        frozenset({("proxy", "lb-2"), ("web_host", "web-a")}): -3.25,
    }, "an offset no worker has learnt for five minutes is gone"


def test_a_tally_sends_its_first_count_at_once_then_the_rest_together_once_per_period(client, db, redis_client):
    tally = selfmetrics.Tally(every=3600)
    tally.add(selfmetrics.heartbeat_fields("accepted", 0.002))
    assert of(scrape(client), "llmgw_heartbeats_accepted_total") == 1
    for seconds in (0.002, 0.004):
        tally.add(selfmetrics.heartbeat_fields("accepted", seconds))
    assert of(scrape(client), "llmgw_heartbeats_accepted_total") == 1, "held until the period is over"
    tally.sent_at -= 3600
    tally.add(selfmetrics.heartbeat_fields("accepted", 0.004))
    found = scrape(client)
    assert of(found, "llmgw_heartbeats_accepted_total") == 4
    assert of(found, "llmgw_heartbeat_handling_seconds_count") == 4
    assert of(found, "llmgw_heartbeat_handling_seconds_sum") == pytest.approx(0.012)
    assert of(found, "llmgw_heartbeat_handling_seconds_bucket", le="0.0025") == 2
    assert of(found, "llmgw_heartbeat_handling_seconds_bucket", le="0.005") == 4


def test_the_stale_task_counts_its_runs(db, redis_client):
    from inventory.tasks import mark_stale

    mark_stale()
    mark_stale()
    assert selfmetrics.read(redis_client.hgetall(keys.SELF_METRICS))["sweeps"] == 2


def test_without_redis_the_inventory_is_still_exported(client, cluster, settings):
    with redis_unreachable(settings):
        found = scrape(client)
    assert of(found, "llmgw_loadstore_up") == 0
    assert len(named(found, "llmgw_node_state")) == 4


def test_an_empty_fleet_exports_the_control_plane_alone(client, db, redis_client):
    found = scrape(client)
    assert of(found, "llmgw_loadstore_up") == 1
    assert named(found, "llmgw_node_state") == {}


def test_a_token_is_required_when_one_is_set(client, cluster, redis_client, settings):
    settings.LLMGW_METRICS_TOKEN = "s3cret"
    assert client.get("/metrics").status_code == 401
    assert client.get("/metrics", headers={"Authorization": "Bearer wrong"}).status_code == 401
    assert client.get("/metrics", headers={"Authorization": "Basic s3cret"}).status_code == 401
    response = client.get("/metrics", headers={"Authorization": "Bearer s3cret"})
    assert response.status_code == 200
    assert "llmgw_node_state" in body(response)


def test_only_get(client, db):
    assert client.post("/metrics").status_code == 405


@pytest.mark.parametrize("count", [10, 500])
def test_a_scrape_runs_the_same_queries_whatever_the_fleet_size(
    client, db, redis_client, count, django_assert_num_queries
):
    from nodes.metrics import inventory_series
    from tests import factories

    ids = factories.build(count, at=time.time())
    factories.save_loads(ids, time.time())
    # As a new process would: an earlier test's empty tables would otherwise be kept, rightly, unread.
    inventory_series.forget()
    # Nodes, GPUs, GPU conditions, filesystems, allocations, GPU claims, engine installs; on PostgreSQL the
    # tables' marks first (a scrape with nothing changed reads only those and the nodes: test_metrics_tablemarks).
    with django_assert_num_queries(7 + (connection.vendor == "postgresql")):
        found = scrape(client)
    assert len(named(found, "llmgw_shard_cpu_cores")) == 4 * count
    # Four shards of two GPUs each hold all eight GPUs of every node.
    assert list(named(found, "llmgw_shard_allocated_gpus").values()) == [2] * 4 * count
    assert list(named(found, "llmgw_node_gpus_free").values()) == [0] * count


def test_a_database_failure_is_answered_503_not_a_cut_off_body(client, db, redis_client, monkeypatch):
    from django.db import OperationalError

    from nodes.metrics import inventory_series

    def unavailable():
        raise OperationalError("the database is down")

    monkeypatch.setattr(inventory_series, "read", unavailable)
    response = client.get("/metrics")
    assert response.status_code == 503


def test_the_node_facts_exported_are_the_agents_and_the_state():
    from inventory.models import AGENT_FIELDS
    from nodes.metrics.inventory_series import NodeFacts

    assert set(NodeFacts._fields) - {"id", "admin_state", "liveness"} <= set(AGENT_FIELDS)
