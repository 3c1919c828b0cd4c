"""The admin shows engine installs as the agent reports them (a failed one with its log tail, as text)
and each placed shard's endpoint."""

from __future__ import annotations

import pytest

from agent import protocol
from inventory.models import Replica
from inventory.reconcile import reconcile
from inventory.registration import upsert_inventory
from tests.factories import deployment, make_inventory, node

pytestmark = pytest.mark.django_db

TAIL = "[ 40%] Building ggml.c\n<b>error</b>: out of memory\nmake: *** Error 2"


def test_a_failed_install_shows_its_log_tail_escaped_in_a_pre(client, operator):
    node("cpu-1", gpus=0)
    failed = protocol.EngineInstall(engine="llama.cpp", version="0.3.36", variant="cpu", state="failed", detail=TAIL)
    upsert_inventory("cpu-1", make_inventory("cpu-1.example", provision=[failed]))
    client.force_login(operator)
    html = client.get("/admin/inventory/node/cpu-1/change/").content.decode()
    assert '<span class="llmgw-install-failed">failed</span>' in html
    assert '<pre class="llmgw-log-tail"><bdi>[ 40%] Building ggml.c\n&lt;b&gt;error&lt;/b&gt;: out of memory' in html
    assert "<b>error</b>" not in html


def test_a_replica_page_shows_where_clients_reach_its_engine(client, operator):
    node("cpu-1", gpus=0)
    deployment(engine="llama.cpp", model_source="/models/g.gguf", gpus_per_shard=0, gpu_class="")
    reconcile()
    replica = Replica.objects.get()
    shard = replica.shards.get()
    client.force_login(operator)
    html = client.get(f"/admin/inventory/replica/{replica.pk}/change/").content.decode()
    address = shard.node.mgmt_addr
    assert f"<code>http://{address}:{shard.port}/v1</code>" in html
