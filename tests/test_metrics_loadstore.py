"""The load store keeps what the pages read and what /metrics reads, written together."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry

from agent import protocol
from livestate import keys, loadlines, loadstore
from nodes.metrics.collector import FleetCollector

LOAD = protocol.Load(cpu_percent=50, cpus=8, shards=[protocol.ShardLoad(shard="s", cpu_cores=1, rss_bytes=2)])


def test_save_keeps_the_load_for_the_pages_and_its_text_for_metrics(redis_client, settings):
    settings.LLMGW_LOAD_MAX_AGE = 60
    loadstore.save("n1", LOAD, received_at=1000.0)
    assert loadstore.fetch(["n1", "n2"], now=1030.0) == {"n1": loadstore.StoredLoad(1000.0, LOAD)}
    assert loadstore.fetch(["n1"], now=1061.0) == {}
    assert loadstore.fetch(["n1"], fresh_only=False, now=1061.0)["n1"].load == LOAD
    stored = loadlines.parse(redis_client.get(keys.load_lines("n1")))
    assert stored.received_at == 1000.0
    assert stored.shards == [[b"s", b"1.0", b"2.0"]]
    # Both keys expire by themselves once nobody may show them.
    assert 0 < redis_client.ttl(keys.load("n1")) <= 120
    assert 0 < redis_client.ttl(keys.load_lines("n1")) <= 120


def test_freshness_is_one_rule_at_the_boundary_and_with_a_margin(settings):
    settings.LLMGW_LOAD_MAX_AGE = 60
    assert loadstore.is_fresh(1000.0, now=1060.0)
    assert not loadstore.is_fresh(1000.0, now=1060.5)
    # A render kept 20 s may only hold loads that stay fresh that long.
    assert loadstore.is_fresh(1000.0, now=1040.0, margin=20)
    assert not loadstore.is_fresh(1000.0, now=1041.0, margin=20)
    # A margin longer than the age itself leaves out everything but a load of this instant.
    assert not loadstore.is_fresh(1000.0, now=1001.0, margin=90)


def test_figures_are_read_from_the_same_store_under_the_same_rule(redis_client, settings):
    settings.LLMGW_LOAD_MAX_AGE = 60
    load = protocol.Load(cpu_percent=50, cpus=8, load1=2.5, memory_used_bytes=1, memory_available_bytes=3)
    loadstore.save("n1", load, received_at=1000.0)
    loadstore.save("n2", load, received_at=900.0)
    redis_client.set(keys.load("n3"), b"not msgpack")
    figures = loadstore.fetch_figures(["n1", "n2", "n3", "n4"], now=1030.0)
    assert list(figures) == ["n1"]
    assert (figures["n1"].cpu_percent, figures["n1"].load1, figures["n1"].memory_fraction) == (50, 2.5, 0.25)
    assert loadstore.fetch(["n3"], fresh_only=False, now=1030.0) == {}


def test_many_loads_are_read_in_mgets_of_a_batch_so_heartbeats_are_answered_between_them(
    redis_client, settings, monkeypatch
):
    settings.LLMGW_LOAD_MAX_AGE = 60
    ids = [f"n{i}" for i in range(7)]
    for node_id in ids:
        loadstore.save(node_id, LOAD, received_at=1000.0)
    monkeypatch.setattr(loadstore, "MGET_BATCH", 3)
    sizes = []
    mget = redis_client.mget

    def counted(names):
        sizes.append(len(names))
        return mget(names)

    monkeypatch.setattr(redis_client, "mget", counted)
    assert set(loadstore.fetch(ids, now=1030.0)) == set(ids)
    assert [stored is not None for stored in loadstore.read_lines([*ids, "absent"])] == [True] * 7 + [False]
    assert sizes == [3, 3, 1, 3, 3, 2]


def test_save_on_a_callers_pipeline_sends_nothing_until_it_executes(redis_client):
    pipe = redis_client.pipeline(transaction=False)
    loadstore.save("n1", LOAD, received_at=1.0, pipe=pipe)
    assert redis_client.exists(keys.load("n1"), keys.load_lines("n1")) == 0
    pipe.execute()
    assert redis_client.exists(keys.load("n1"), keys.load_lines("n1")) == 2


@pytest.mark.django_db
def test_registering_the_collector_runs_no_query(django_assert_num_queries):
    with django_assert_num_queries(0):
        CollectorRegistry(auto_describe=True).register(FleetCollector())


@pytest.mark.django_db
@pytest.mark.parametrize("encoding", ["identity", "gzip"])
def test_the_cyclic_collector_runs_again_after_a_scrape_however_it_ends(client, redis_client, encoding):
    import gc

    headers = {"Accept-Encoding": encoding}
    b"".join(client.get("/metrics", headers=headers).streaming_content)
    assert gc.isenabled()
    response = client.get("/metrics", headers=headers)
    next(iter(response.streaming_content))
    assert not gc.isenabled()  # paused while the scrape is being written
    response.close()
    assert gc.isenabled()
