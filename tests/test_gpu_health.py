"""A sick GPU leaves placement, not its node (issue 16, item 5): evidence, hysteresis, rebuild, the operator's word."""

from __future__ import annotations

import msgspec
import pytest
from django.contrib.admin.models import LogEntry

from agent import protocol
from inventory.gpuhealth import RECOVERY_SAMPLES
from inventory.models import GPU, GPUCondition, NodeEvent, Replica, ReplicaState, Shard
from inventory.reconcile import reconcile
from tests.agentapi import JOIN_TOKEN, a_load, heartbeat, register, reply_of
from tests.factories import deployment

pytestmark = [pytest.mark.django_db]


@pytest.fixture(autouse=True)
def _join_token(settings, redis_client):
    settings.LLMGW_JOIN_TOKEN = JOIN_TOKEN


@pytest.fixture
def token(client):
    """gpu-1: two H100s, a one-GPU replica running on GPU 0."""
    token = register(client, "gpu-1", gpus=2)
    reply_of(heartbeat(client, token, protocol.Heartbeat()))
    deployment("small", gpus_per_shard=1)
    reconcile()
    assert Shard.objects.get().gpu_indices == [0]
    return token


def running() -> list[protocol.ShardStatus]:
    """What gpu-1's agent says of its shards: every one it runs is running."""
    shards = Shard.objects.filter(node_id="gpu-1", state__in=("placed", "starting", "running"))
    return [protocol.ShardStatus(shard=s.shard_id, state="running") for s in shards]


def beat(client, token: str, shards: list | None = None, **gpu0) -> protocol.HeartbeatReply:
    """A heartbeat whose load has GPU 0 sampled with `gpu0`'s fields and GPU 1 clean."""
    load = a_load()
    load.gpus = [
        protocol.GPULoad(index=0, uuid="GPU-gpu-1.example-0", utilization_percent=50.0, **gpu0),
        protocol.GPULoad(index=1, uuid="GPU-gpu-1.example-1", clean_samples=500),
    ]
    shards = running() if shards is None else shards
    return reply_of(heartbeat(client, token, protocol.Heartbeat(load=load, shards=shards)))


def gpu0() -> GPU:
    return GPU.objects.get(node_id="gpu-1", index=0)


def test_an_xid_that_fails_a_gpu_rebuilds_its_replica_on_another_gpu_of_the_node(client, token):
    beat(client, token, clean_samples=3)
    reply = beat(client, token, xids=[79])

    assert gpu0().condition == GPUCondition.FAILED
    assert "XID 79 (fallen off the bus)" in gpu0().condition_reason
    old = Replica.objects.get(replica_id="small-r1")
    assert old.state == ReplicaState.FAILED and old.reason == "GPU 0 of gpu-1 failed"
    assert reply.shards == [], "the agent is still told to run on a failed GPU"
    assert reconcile().placed == ["small-r2"]
    assert Shard.objects.get(replica__replica_id="small-r2").gpu_indices == [1], "the node's other GPU stays usable"
    event = NodeEvent.objects.get(kind=NodeEvent.Kind.GPU)
    assert (event.from_state, event.to_state, event.actor) == ("healthy", "failed", "system")


def test_a_failed_gpu_does_not_come_back_on_good_samples(client, token):
    beat(client, token, xids=[48])
    beat(client, token, clean_samples=1)
    beat(client, token, clean_samples=10 * RECOVERY_SAMPLES)
    reconcile()

    assert gpu0().condition == GPUCondition.FAILED
    assert not GPU.objects.filter(node_id="gpu-1", index=0).free().exists()


def test_a_degraded_gpu_keeps_its_replica_takes_nothing_new_and_needs_a_clean_run_to_return(client, token):
    beat(client, token, xids=[94])
    assert gpu0().condition == GPUCondition.DEGRADED
    assert Replica.objects.get(replica_id="small-r1").state != ReplicaState.FAILED
    assert not GPU.objects.filter(node_id="gpu-1", index=0).free().exists()

    beat(client, token, clean_samples=1)
    reconcile()
    assert gpu0().condition == GPUCondition.DEGRADED, "one good sample brought it back"
    beat(client, token, clean_samples=RECOVERY_SAMPLES - 1)
    reconcile()
    assert gpu0().condition == GPUCondition.DEGRADED

    beat(client, token, clean_samples=RECOVERY_SAMPLES)
    result = reconcile()
    assert result.recovered_gpus == ["gpu-1/0"]
    assert gpu0().condition == GPUCondition.HEALTHY and gpu0().condition_reason == ""
    assert [e.to_state for e in NodeEvent.objects.filter(kind=NodeEvent.Kind.GPU).order_by("at", "id")] == [
        "degraded",
        "healthy",
    ]


def test_degraded_evidence_never_lightens_a_failed_gpu(client, token):
    beat(client, token, remap_failed=True)
    beat(client, token, remap_pending=True)
    assert gpu0().condition == GPUCondition.FAILED
    assert NodeEvent.objects.filter(kind=NodeEvent.Kind.GPU).count() == 1


def test_a_level_that_stays_keeps_the_gpu_degraded(client, token):
    beat(client, token, remap_pending=True)
    for _ in range(3):
        beat(client, token, remap_pending=True)  # the agent's streak stays 0 while rows wait for a reset
        reconcile()
    assert gpu0().condition == GPUCondition.DEGRADED
    assert NodeEvent.objects.filter(kind=NodeEvent.Kind.GPU).count() == 1, "the same evidence recorded twice"


def test_evidence_about_another_card_is_ignored(client, token):
    load = a_load()
    load.gpus = [protocol.GPULoad(index=0, uuid="GPU-some-other-card", xids=[79])]
    reply_of(heartbeat(client, token, protocol.Heartbeat(load=load)))
    assert gpu0().condition == GPUCondition.HEALTHY


def test_a_clean_load_reads_no_database_row(client, token, django_assert_num_queries):
    beat(client, token, clean_samples=1)  # the report moves the shard to running
    beat(client, token, clean_samples=2)  # the shard list is cached from here
    reports = running()
    with django_assert_num_queries(0):
        beat(client, token, shards=reports, clean_samples=3)


# -- the operator's word ------------------------------------------------------------------------


def mark_healthy(client, reason: str):
    return client.post(
        "/admin/inventory/gpu/",
        {"action": "mark_healthy", "_selected_action": [gpu0().pk], "apply": "1", "reason": reason},
    )


def test_an_operator_marks_a_failed_gpu_healthy_with_a_reason(client, token, operator):
    beat(client, token, xids=[79])
    client.force_login(operator)
    listing = client.get("/admin/inventory/gpu/?condition=failed").content.decode()
    assert "XID 79 (fallen off the bus)" in listing and "gpu-1/gpu0" in listing
    assert client.get(f"/admin/inventory/gpu/{gpu0().pk}/change/").status_code == 200
    asked = client.post("/admin/inventory/gpu/", {"action": "mark_healthy", "_selected_action": [gpu0().pk]})
    assert b"reason" in asked.content and gpu0().condition == GPUCondition.FAILED, "acted before asking why"

    response = mark_healthy(client, "reseated the card, nvidia-smi -r, burn-in passed")

    assert response.status_code == 302
    assert gpu0().condition == GPUCondition.HEALTHY
    event = NodeEvent.objects.filter(kind=NodeEvent.Kind.GPU).first()
    assert (event.from_state, event.to_state, event.actor) == ("failed", "healthy", "operator")
    assert event.reason == "GPU 0: reseated the card, nvidia-smi -r, burn-in passed"
    log = LogEntry.objects.get()
    assert log.user == operator and "reseated the card" in log.get_change_message()
    assert GPU.objects.filter(node_id="gpu-1", index=0).free().exists(), "back in placement"


def test_marking_healthy_needs_a_reason(client, token, operator):
    beat(client, token, xids=[79])
    client.force_login(operator)
    response = mark_healthy(client, "   ")
    assert response.status_code == 200 and b"This field is required" in response.content
    assert gpu0().condition == GPUCondition.FAILED
    assert not LogEntry.objects.exists()


def test_a_viewer_cannot_mark_a_gpu_healthy(client, token, viewer):
    beat(client, token, xids=[79])
    client.force_login(viewer)
    response = mark_healthy(client, "I think it is fine")
    assert response.status_code in (302, 403)
    assert gpu0().condition == GPUCondition.FAILED


def test_the_evidence_wins_over_an_operator_who_cleared_too_soon(client, token, operator):
    beat(client, token, ecc_uncorrected=2)
    client.force_login(operator)
    mark_healthy(client, "looks fine to me")
    assert gpu0().condition == GPUCondition.HEALTHY
    beat(client, token, ecc_uncorrected=2)  # not reset: the volatile count is still there
    assert gpu0().condition == GPUCondition.FAILED


def test_a_reregistration_keeps_a_failed_gpu_failed(client, token):
    beat(client, token, xids=[79])
    register(client, "gpu-1", gpus=2)
    assert gpu0().condition == GPUCondition.FAILED


@pytest.mark.parametrize(
    "field, value",
    [("uuid", "GPU-0\n"), ("uuid", "GPU\x1e0"), ("utilization_percent", 101), ("xids", list(range(17)))],
)
def test_a_bad_gpu_sample_is_refused_naming_the_field(client, token, field, value):
    body = protocol.encode(protocol.Heartbeat(load=a_load())).decode()
    gpu = (
        protocol.encode(protocol.GPULoad(index=0)).decode()[:-1]
        + f",{msgspec.json.encode({field: value}).decode()[1:]}"
    )
    body = body[:-2] + f',"gpus":[{gpu}]}}}}'
    response = heartbeat(client, token, body.encode())
    assert response.status_code == 400
    assert msgspec.json.decode(response.content)["field"] == f"$.load.gpus[0].{field}"
