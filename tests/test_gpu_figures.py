"""Each GPU measured (issue 16, item 4): from a stand-in NVML, via the agent's heartbeat to /metrics and the page."""

from __future__ import annotations

import shutil
import sys
import time
from pathlib import Path

import pytest
import time_machine

from agent import config as agent_config
from agent.loop import Agent
from agent.procfs import Roots
from inventory.models import GPU, GPUCondition, Shard
from inventory.reconcile import reconcile
from tests.agent.fakenvml import FakeGPU, FakeNVML
from tests.agentapi import JOIN_TOKEN, heartbeat, register, reply_of
from tests.factories import deployment
from tests.metrics_scrape import TEXT, body, named, of, samples

pytestmark = [pytest.mark.django_db]

PROC = Path(__file__).parent / "agent" / "fixtures"


@pytest.fixture(autouse=True)
def _join_token(settings, redis_client):
    settings.LLMGW_JOIN_TOKEN = JOIN_TOKEN


@pytest.fixture
def nvml(monkeypatch) -> FakeNVML:
    """gpu-1's two H100s, as registration's inventory names them (tests.factories.make_inventory)."""
    fake = FakeNVML([FakeGPU("GPU-gpu-1.example-0"), FakeGPU("GPU-gpu-1.example-1")])
    fake.gpus[0].utilization, fake.gpus[0].used = 87, 61 * 2**30
    fake.gpus[0].temperature, fake.gpus[0].power_mw = 71, 612_000
    fake.gpus[1].utilization, fake.gpus[1].temperature, fake.gpus[1].power_mw = 3, 34, None
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    return fake


@pytest.fixture
def agent(tmp_path, nvml) -> Agent:
    """The real agent over fixture /proc trees; its heartbeats are posted by the test, through the real API."""
    shutil.copytree(PROC / "proc", tmp_path / "proc")
    config = agent_config.from_mapping(
        {
            "control_plane": "http://127.0.0.1:1",
            "join_token": JOIN_TOKEN,
            "state_dir": str(tmp_path / "state"),
            "node_id": "gpu-1",
            "engines": {},
        }
    )
    made = Agent(config, roots=Roots(proc=tmp_path / "proc", sys=tmp_path, etc=tmp_path))
    assert made.sample_now() is None, "the first reading is a baseline"
    shutil.rmtree(tmp_path / "proc")
    shutil.copytree(PROC / "proc-later", tmp_path / "proc")
    return made


@pytest.fixture
def token(client) -> str:
    return register(client, "gpu-1", gpus=2)


def send(client, token: str, agent: Agent):
    """One sample and one heartbeat, as the agent's loops make them, posted to the control plane."""
    load = agent.sample_now()
    assert load is not None and load.gpus
    message = agent.heartbeat_message(load, with_inventory=False)
    return reply_of(heartbeat(client, token, message))


def scrape(client) -> dict:
    response = client.get("/metrics", headers={"Accept": TEXT})
    assert response.status_code == 200
    return samples(body(response))


def test_gpu_figures_reach_metrics_with_node_gpu_and_uuid(client, token, agent):
    send(client, token, agent)
    found = scrape(client)

    gpu0 = {"node": "gpu-1", "gpu": "0", "uuid": "GPU-gpu-1.example-0"}
    gpu1 = {"node": "gpu-1", "gpu": "1", "uuid": "GPU-gpu-1.example-1"}
    assert of(found, "llmgw_gpu_utilization_percent", **gpu0) == 87
    assert of(found, "llmgw_gpu_memory_used_bytes", **gpu0) == 61 * 2**30
    assert of(found, "llmgw_gpu_temperature_celsius", **gpu0) == 71
    assert of(found, "llmgw_gpu_power_watts", **gpu0) == 612
    assert of(found, "llmgw_gpu_temperature_celsius", **gpu1) == 34
    assert of(found, "llmgw_gpu_power_watts", **gpu1) is None, "a figure the board cannot give is left out"
    assert of(found, "llmgw_gpu_health", **gpu0, state="healthy") == 1


def test_gpu_figures_leave_metrics_with_the_load(client, token, agent):
    send(client, token, agent)
    with time_machine.travel(time.time() + 61):
        found = scrape(client)
    assert not named(found, "llmgw_gpu_utilization_percent")
    assert not named(found, "llmgw_gpu_temperature_celsius")
    assert len(named(found, "llmgw_gpu_health")) == 2, "the inventory's series stay"


def test_the_node_page_lists_each_gpus_figures(client, token, agent, viewer):
    send(client, token, agent)
    client.force_login(viewer)
    page = client.get("/nodes/gpu-1/").content.decode()

    row = page[page.index('data-gpu="0"') :]
    row = row[: row.index("</tr>")]
    assert '<td class="numeric gpu-utilization">87%</td>' in row
    assert '<td class="numeric gpu-temperature">71 °C</td>' in row
    assert '<td class="numeric gpu-power">612 W</td>' in row
    assert "61.0 GiB" in row
    assert "healthy" in row


def test_an_xid_from_nvml_fails_the_gpu_and_its_replica_moves(client, token, agent, nvml, viewer):
    deployment("small", gpus_per_shard=1)
    reconcile()
    assert Shard.objects.get().gpu_indices == [0]
    nvml.xid(0, 79)

    send(client, token, agent)

    assert GPU.objects.get(node_id="gpu-1", index=0).condition == GPUCondition.FAILED
    assert reconcile().placed == ["small-r2"]
    assert Shard.objects.get(replica__replica_id="small-r2").gpu_indices == [1]
    found = scrape(client)
    assert of(found, "llmgw_gpu_health", node="gpu-1", gpu="0", uuid="GPU-gpu-1.example-0", state="failed") == 1
    client.force_login(viewer)
    page = client.get("/nodes/gpu-1/").content.decode()
    row = page[page.index('data-gpu="0"') :]
    assert "XID 79 (fallen off the bus)" in row[: row.index("</tr>")]


@pytest.mark.django_db(transaction=True)
def test_the_agents_own_heartbeats_deliver_an_xid_once(live_server, tmp_path, nvml):
    """The agent's own client against a served control plane: it registers, the XID fails the GPU, and once
    that heartbeat is answered the XID is not sent again."""
    shutil.copytree(PROC / "proc", tmp_path / "proc")
    config = agent_config.from_mapping(
        {
            "control_plane": live_server.url,
            "join_token": JOIN_TOKEN,
            "state_dir": str(tmp_path / "state"),
            "node_id": "gpu-1",
            "engines": {},
        }
    )
    own = Agent(config, roots=Roots(proc=tmp_path / "proc", sys=tmp_path, etc=tmp_path))
    own.start_up(run_shards=False)
    shutil.rmtree(tmp_path / "proc")
    shutil.copytree(PROC / "proc-later", tmp_path / "proc")
    nvml.xid(1, 48)
    own.sample_now()
    assert own.latest.gpus[1].xids == [48]

    own.beat_once()

    failed = GPU.objects.get(node_id="gpu-1", index=1)
    assert failed.condition == GPUCondition.FAILED and "XID 48" in failed.condition_reason
    assert own.gpus.pending[1] == [], "an answered XID is still waiting to be sent"
    own.gpus.close()
