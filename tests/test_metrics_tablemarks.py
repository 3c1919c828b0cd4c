"""The inventory's tables read again for /metrics only when they changed (nodes/metrics/tablemarks.py).

Every change a scrape must show is made between two scrapes in the same test (one
transaction, as pytest-django runs it), so a mark that missed an update inside a
transaction, or a part kept past its tables' change, fails here on PostgreSQL. On
SQLite every scrape reads every table, and the same changes must show there too.
"""

from __future__ import annotations

import time

import pytest
from django.db import connection
from django.test import Client

from inventory.models import GPU, Deployment, EngineInstall, Filesystem, GPUClaim, GPUCondition
from nodes.metrics import tablemarks
from tests import factories
from tests.metrics_scrape import TEXT, body, named, of, samples

pytestmark = pytest.mark.django_db
postgresql_only = pytest.mark.skipif(connection.vendor != "postgresql", reason="marks are PostgreSQL's row versions")


def scrape(client: Client) -> dict:
    response = client.get("/metrics", headers={"Accept": TEXT})
    assert response.status_code == 200
    return samples(body(response))


@pytest.fixture
def fleet(redis_client) -> list[str]:
    ids = factories.build(3, at=time.time())
    factories.save_loads(ids, time.time())
    return ids


@postgresql_only
def test_a_mark_moves_with_an_insert_an_update_in_the_same_transaction_and_a_delete(fleet):
    table = GPU._meta.db_table

    def mark() -> str:
        marks = tablemarks.read([table])
        assert marks is not None
        return marks[table]

    first = mark()
    assert mark() == first
    GPU.objects.filter(node_id=fleet[0], index=0).update(condition=GPUCondition.FAILED)
    updated = mark()
    assert updated != first
    # The same row again, in the same transaction: only the command differs.
    GPU.objects.filter(node_id=fleet[0], index=0).update(condition=GPUCondition.DEGRADED)
    again = mark()
    assert again != updated
    GPU.objects.filter(node_id=fleet[0], index=7).delete()
    assert mark() != again


@pytest.mark.skipif(connection.vendor == "postgresql", reason="PostgreSQL has marks")
def test_without_marks_every_scrape_reads_every_table(client, fleet, django_assert_num_queries):
    assert tablemarks.read([GPU._meta.db_table]) is None
    first = scrape(client)
    # Nodes, GPUs, GPU conditions, filesystems, GPU claims, allocations, engine installs: again, unchanged.
    with django_assert_num_queries(7):
        assert scrape(client) == first


@postgresql_only
def test_a_scrape_with_no_change_reads_only_the_marks_and_the_nodes(client, fleet, django_assert_num_queries):
    first = scrape(client)
    with django_assert_num_queries(2):
        again = scrape(client)
    assert again == first
    # Some rows of each part, so that the assertion above compared something.
    assert len(named(again, "llmgw_gpu_health")) == 3 * 8
    assert len(named(again, "llmgw_shard_allocated_gpus")) == 3 * 4
    assert len(named(again, "llmgw_node_local_disk_free_bytes")) == 3


def test_a_gpu_failed_between_scrapes_is_seen_at_the_next(client, fleet):
    def states(found: dict) -> dict[str, str]:
        return {
            dict(labels)["gpu"]: dict(labels)["state"]
            for labels in named(found, "llmgw_gpu_health")
            if ("node", fleet[1]) in labels
        }

    assert set(states(scrape(client)).values()) == {"healthy"}
    GPU.objects.filter(node_id=fleet[1], index=3).update(condition=GPUCondition.FAILED)
    after = states(scrape(client))
    assert after.pop("3") == "failed"
    assert set(after.values()) == {"healthy"}


def test_a_claim_released_between_scrapes_frees_its_gpu_at_the_next(client, fleet):
    assert sum(named(scrape(client), "llmgw_node_gpus_free").values()) == 0
    GPUClaim.objects.filter(node_id=fleet[2], gpu_index=5).delete()
    found = scrape(client)
    assert {dict(labels)["node"]: value for labels, value in named(found, "llmgw_node_gpus_free").items()} == {
        fleet[0]: 0,
        fleet[1]: 0,
        fleet[2]: 1,
    }


def test_a_filesystem_filled_between_scrapes_is_seen_at_the_next(client, fleet):
    before = of(scrape(client), "llmgw_node_local_disk_free_bytes", node=fleet[0])
    Filesystem.objects.filter(node_id=fleet[0], shared=False).update(free_bytes=2**30)
    assert before != 2**30
    assert of(scrape(client), "llmgw_node_local_disk_free_bytes", node=fleet[0]) == 2**30


def test_a_served_model_renamed_between_scrapes_is_seen_at_the_next(client, redis_client):
    factories.node("gpu-1")
    replica = factories.place("chat", {"gpu-1": [0, 1]})
    assert {dict(labels)["served_model"] for labels in named(scrape(client), "llmgw_shard_allocated_gpus")} == {"chat"}
    # Only the deployment's row changes: its allocations' label must follow.
    Deployment.objects.filter(pk=replica.deployment.pk).update(served_model_name="assistant")
    found = scrape(client)
    assert {dict(labels)["served_model"] for labels in named(found, "llmgw_shard_allocated_gpus")} == {"assistant"}


def test_an_install_that_failed_between_scrapes_is_seen_at_the_next(client, fleet):
    EngineInstall.objects.create(node_id=fleet[0], engine="vllm", version="0.10.1", state=EngineInstall.State.READY)
    install = {"node": fleet[0], "engine": "vllm", "version": "0.10.1", "variant": ""}
    assert of(scrape(client), "llmgw_engine_install_state", **install, state="ready") == 1
    EngineInstall.objects.filter(node_id=fleet[0]).update(state=EngineInstall.State.FAILED)
    assert of(scrape(client), "llmgw_engine_install_state", **install, state="failed") == 1
