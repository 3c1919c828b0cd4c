"""The node page's engines: installs with their state and log tail, shards with why they are in their state,
their endpoint, and resident memory beside the profile's claim."""

from __future__ import annotations

import re
import time

import pytest

from agent import protocol
from agent.protocol import Load, ShardLoad
from inventory.desired import sync_node
from inventory.models import Shard
from inventory.reconcile import reconcile
from inventory.registration import upsert_inventory
from livestate import loadstore
from tests.factories import deployment, make_inventory, node

HTMX = {"HTTP_HX_REQUEST": "true"}
LLAMA = dict(engine="llama.cpp", model_source="/models/gemma.gguf", gpus_per_shard=0, gpu_class="")
TAIL = "cmake --build build\n/src/ggml.c:12: error: <script>alert(1)</script>\nmake: *** [all] Error 2"

pytestmark = pytest.mark.django_db


@pytest.fixture
def page(client, viewer, redis_client):
    client.force_login(viewer)

    def get(node_id: str = "cpu-1") -> str:
        # The live partial is what refreshes every 5 s: everything here must be in it.
        return client.get(f"/nodes/{node_id}/", **HTMX).content.decode()

    return get


def report(*installs: protocol.EngineInstall) -> None:
    inventory = make_inventory("cpu-1.example", memory_total_bytes=64 * 2**30, cpus=16, provision=list(installs))
    inventory.mgmt_addr = "10.1.2.3"
    upsert_inventory("cpu-1", inventory)


def llama(state: str, detail: str = "") -> protocol.EngineInstall:
    return protocol.EngineInstall(engine="llama.cpp", version="0.3.36", variant="cpu", state=state, detail=detail)


def row_of(html: str, shard_id: str) -> str:
    return re.search(rf"<tr>\s*<td><code>{shard_id}</code>.*?</tr>", html, re.S).group(0)


def test_a_failed_install_shows_its_log_tail_as_text_in_a_pre(page):
    node("cpu-1", gpus=0)
    report(llama("failed", TAIL))
    html = page()
    item = re.search(r'<li data-install-state="failed">.*?</li>', html, re.S).group(0)
    assert '<span class="provision-failed">failed</span>' in item
    assert '<pre class="log-tail"><bdi>cmake --build build\n/src/ggml.c:12: error: &lt;script&gt;' in item
    assert "<script>alert" not in html


def test_a_placed_shard_says_which_install_it_waits_for_then_its_endpoint(page):
    node("cpu-1", gpus=0)
    report(llama("installing", "building llama-server: 42 %"))
    deployment(**LLAMA, memory_gb_per_shard=1, served_model_name="gemma-chat")
    reconcile()
    shard = Shard.objects.get()
    row = row_of(page(), shard.shard_id)
    # What clients send through the gateway, beside the file it is served from.
    assert '<code class="served-model" title="served as">gemma-chat</code>' in row
    assert ">placed</span>" in row
    assert "waiting for llama.cpp 0.3.36: building llama-server: 42 %" in row
    assert f"<code>http://10.1.2.3:{shard.port}/v1</code>" in row
    assert '<li data-install-state="installing">' in page()


def test_an_exited_engine_shows_its_exit_code_and_last_lines_and_a_failed_one_stays_listed(page):
    node("cpu-1", gpus=0)
    deployment(**LLAMA)
    reconcile()
    (spec,) = sync_node("cpu-1")
    exited = protocol.ShardStatus(shard=spec.shard, state="exited", exit_code=1, restarts=2, detail="gguf: bad magic")
    sync_node("cpu-1", [exited])
    row = row_of(page(), spec.shard)
    assert ">starting</span>" in row and "exited, exit code 1, 2 restarts, gguf: bad magic" in row
    failed = protocol.ShardStatus(shard=spec.shard, state="failed", exit_code=137, detail="killed")
    sync_node("cpu-1", [failed])
    row = row_of(page(), spec.shard)
    assert ">failed</span>" in row and "exit code 137" in row and "killed" in row


@pytest.mark.parametrize(("resident_gib", "flagged"), [(1.2, False), (1.25, True)])
def test_resident_memory_over_the_claim_by_more_than_20_percent_is_flagged(page, resident_gib, flagged):
    node("cpu-1", gpus=0)
    deployment(**LLAMA, memory_gb_per_shard=1)
    reconcile()
    shard = Shard.objects.get()
    shard_load = ShardLoad(shard=shard.shard_id, cpu_cores=1.0, rss_bytes=int(resident_gib * 2**30))
    loadstore.save("cpu-1", Load(cpu_percent=10, cpus=16, shards=[shard_load]), time.time())
    row = row_of(page(), shard.shard_id)
    assert ("over claim" in row) is flagged
    assert "1 GB" in row
