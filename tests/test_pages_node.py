"""The node page `/nodes/<id>/`, its live partial, its charts and the operator actions."""

from __future__ import annotations

import re
import socket
import time

import pytest
from django.conf import settings
from django.test import Client

from agent import protocol
from agent.protocol import Load, ShardLoad
from devstack.faults import redis_unreachable
from devstack.ports import free_port
from inventory.models import REPLICA_COLOURS, AdminState, Allocation, GPUClaim, Node, NodeEvent, ReplicaState, Shard
from inventory.reconcile import reconcile
from inventory.registration import upsert_inventory
from livestate import loadstore
from tests.factories import deployment, make_fleet, make_inventory

HTMX = {"HTTP_HX_REQUEST": "true"}


@pytest.fixture
def viewer_client(client, viewer):
    client.force_login(viewer)
    return client


@pytest.fixture
def operator_client(client, operator):
    client.force_login(operator)
    return client


@pytest.fixture
def placed(cluster):
    """ready-1 holds one shard on GPUs 0 and 1."""
    node = cluster["ready-1"]
    allocation = Allocation.objects.create(
        node=node, shard_id="llama-r0-s0", replica_id="llama-r0", model="meta/llama-3-70b", memory_gb=96
    )
    for index in (0, 1):
        GPUClaim.objects.create(allocation=allocation, node=node, gpu_index=index)
    return node


def test_anonymous_is_sent_to_login(client, cluster):
    response = client.get("/nodes/ready-1/")
    assert response.status_code == 302
    assert response["Location"].startswith(f"{settings.LOGIN_URL}?next=/nodes/ready-1/")


def test_unknown_node_is_404_and_stops_a_poll(viewer_client, db):
    assert viewer_client.get("/nodes/nope/").status_code == 404
    assert viewer_client.get("/nodes/no%00pe/").status_code == 404
    assert viewer_client.get("/nodes/no%00pe/charts/").status_code == 404
    assert viewer_client.get("/nodes/nope/", **HTMX).status_code == 286
    assert viewer_client.get("/nodes/nope/charts/", **HTMX).status_code == 286


def test_page_shows_host_facts_gpus_and_state(viewer_client, cluster, redis_client):
    upsert_inventory(
        "ready-1",
        make_inventory(
            "ready-1.example",
            gpus=2,
            engine_versions={"vllm": "0.9.1"},
            engines_probed=True,
            filesystems=[
                protocol.Filesystem(mount="/models", fstype="xfs", total_bytes=4 * 2**40, free_bytes=2**40),
                protocol.Filesystem(mount="/filer", fstype="nfs", total_bytes=2**45, free_bytes=2**44, shared=True),
            ],
            fabrics=[protocol.Fabric(name="ib-east", hcas=["mlx5_0"], rate_gbps=400)],
            weights=[protocol.Weights(path="/models/llama", size_bytes=2**37, format="safetensors")],
            weights_scanned=True,
            provision=[protocol.EngineInstall(engine="vllm", version="0.9.1", state="failed", detail="no CUDA")],
        ),
    )
    html = viewer_client.get("/nodes/ready-1/").content.decode()
    assert 'data-state="ready"' in html
    assert "AMD EPYC 9654</bdi> · 192 logical" in html
    assert "vllm</bdi></dt><dd><bdi>0.9.1" in html
    assert "1.0 TiB</span> free of 4.0 TiB local" in html
    assert "<code>/filer</code> <bdi>nfs</bdi>" in html and ">shared<" in html
    assert "ib-east</bdi> · 400 Gb/s · <bdi>mlx5_0" in html
    assert "<code>/models/llama</code> safetensors" in html
    assert 'class="provision-failed">failed' in html and "no CUDA" in html
    assert html.count("H100-80GB") >= 2
    assert 'id="node-charts"' in html and 'hx-trigger="load, every 30s"' in html


def test_engines_join_allocations_with_the_shards_load(viewer_client, placed, redis_client):
    loadstore.save(
        "ready-1",
        Load(
            cpu_percent=20,
            cpus=192,
            memory_used_bytes=2**37,
            memory_available_bytes=2**38,
            shards=[
                ShardLoad(shard="llama-r0-s0", cpu_cores=3.25, rss_bytes=48 * 2**30),
                ShardLoad(shard="stray-s9", cpu_cores=0.5, rss_bytes=2**30),
            ],
        ),
        time.time(),
    )
    html = viewer_client.get("/nodes/ready-1/").content.decode()
    engines = re.search(r'<table class="engines">.*?</table>', html, re.S).group(0)
    placed_row = re.search(r"<tr>\s*<td><code>llama-r0-s0</code>.*?</tr>", engines, re.S).group(0)
    # Each cell's text, with the <bdi> that isolates an agent string taken off.
    assert [
        re.sub(r"</?bdi>", "", cell) for cell in re.findall(r"<td[^>]*>((?:<bdi>)?[^<]*(?:</bdi>)?)</td>", placed_row)
    ] == [
        "llama-r0",
        "meta/llama-3-70b",
        "0, 1",
        "3.25",
        "48.0 GiB",
        "96 GB",
        # Requests in flight at the gateways: none known without Prometheus.
        "—",
    ]
    assert re.search(r'<tr class="unplaced"[^>]*>\s*<td><code>stray-s9</code>', engines)
    gpus = re.search(r'<table class="gpus">.*?</table>', html, re.S).group(0)
    assert gpus.count("<code>llama-r0-s0</code>") == 2
    assert gpus.count(">free<") == 6


def test_live_partial_comes_back_alone(viewer_client, placed, redis_client):
    loadstore.save("ready-1", Load(cpu_percent=61.5, cpus=192, load1=3.5, load5=2, load15=1), time.time())
    response = viewer_client.get("/nodes/ready-1/", **HTMX)
    html = response.content.decode()
    assert html.lstrip().startswith('<section id="node-live"')
    assert "<html" not in html and "node-charts" not in html and "Versions" not in html
    assert '<span class="num" id="cpu-percent">61.5%</span> · 118.1 of 192 cores' in html
    assert "load 3.50 / 2.00 / 1.00" in html
    assert "HX-Request" in response["Vary"]


def test_stale_load_is_unknown_with_its_age(viewer_client, cluster, redis_client):
    loadstore.save("ready-1", Load(cpu_percent=88, cpus=192), time.time() - settings.LLMGW_LOAD_MAX_AGE - 30)
    html = viewer_client.get("/nodes/ready-1/", **HTMX).content.decode()
    assert "88" not in html
    assert "last load 90 s old" in html or "last load 91 s old" in html


def test_redis_down_renders_from_the_database(viewer_client, placed, settings):
    with redis_unreachable(settings):
        response = viewer_client.get("/nodes/ready-1/")
    html = response.content.decode()
    assert response.status_code == 200
    assert "Redis is not reachable, so current load is unknown" in html
    assert "<code>llama-r0-s0</code>" in html


def test_history_unavailable_when_prometheus_is_down(viewer_client, cluster, settings):
    settings.PROMETHEUS_URL = f"http://127.0.0.1:{free_port()}"
    response = viewer_client.get("/nodes/ready-1/charts/", **HTMX)
    html = response.content.decode()
    assert response.status_code == 200
    assert f"History is unavailable: Prometheus at {settings.PROMETHEUS_URL} is not reachable." in html
    assert 'hx-trigger="every 30s"' in html


def test_history_unavailable_when_prometheus_hangs(viewer_client, cluster, settings):
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(16)
        settings.PROMETHEUS_URL = f"http://127.0.0.1:{listener.getsockname()[1]}"
        started = time.monotonic()
        html = viewer_client.get("/nodes/ready-1/charts/", **HTMX).content.decode()
    assert "did not answer within 2 s" in html
    assert time.monotonic() - started < 4


def test_markup_in_reported_text_is_shown_as_text(viewer_client, db, redis_client):
    upsert_inventory(
        "evil-1",
        make_inventory(
            "<script>alert(1)</script>",
            labels={"x": "<img src=x onerror=alert(2)>"},
            engine_versions={"<b>e</b>": "<i>1</i>"},
        ),
    )
    html = viewer_client.get("/nodes/evil-1/").content.decode()
    for raw in ("<script>alert(1)</script>", "<img src=x onerror=alert(2)>", "<b>e</b>", "<i>1</i>"):
        assert raw not in html
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html


def test_only_operators_see_the_actions(viewer_client, cluster, redis_client, operator):
    assert 'name="action"' not in viewer_client.get("/nodes/ready-1/").content.decode()
    viewer_client.force_login(operator)
    html = viewer_client.get("/nodes/ready-1/").content.decode()
    assert html.count('name="action"') == 3
    assert 'name="csrfmiddlewaretoken"' in html
    assert 'hx-headers=\'{"X-CSRFToken": "' in html


def test_operator_cordons_with_a_reason(operator, cluster):
    client = Client(enforce_csrf_checks=True)
    client.force_login(operator)
    page = client.get("/nodes/ready-1/").content.decode()
    token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page).group(1)
    response = client.post(
        "/nodes/ready-1/admin-state/", {"action": "cordon", "reason": "disk swap", "csrfmiddlewaretoken": token}
    )
    assert response.status_code == 302 and response["Location"] == "/nodes/ready-1/"
    node = Node.objects.get(pk="ready-1")
    assert node.admin_state == AdminState.CORDONED
    assert node.admin_state_by == "operator"
    event = NodeEvent.objects.filter(node=node, kind=NodeEvent.Kind.ADMIN).get()
    assert (event.to_state, event.reason) == ("cordoned", "disk swap")
    assert "ready-1: cordon done." in client.get("/nodes/ready-1/").content.decode()


def test_action_without_csrf_token_is_refused(operator, cluster):
    client = Client(enforce_csrf_checks=True)
    client.force_login(operator)
    response = client.post("/nodes/ready-1/admin-state/", {"action": "cordon", "reason": "x"})
    assert response.status_code == 403
    assert Node.objects.get(pk="ready-1").admin_state == AdminState.ACTIVE


def test_action_needs_a_reason(operator_client, cluster):
    response = operator_client.post("/nodes/ready-1/admin-state/", {"action": "drain", "reason": "  "}, follow=True)
    assert "Drain needs a reason" in response.content.decode()
    assert Node.objects.get(pk="ready-1").admin_state == AdminState.ACTIVE


def test_unknown_action_changes_nothing(operator_client, cluster):
    response = operator_client.post("/nodes/ready-1/admin-state/", {"action": "reboot", "reason": "x"}, follow=True)
    assert "Unknown action." in response.content.decode()
    assert Node.objects.get(pk="ready-1").admin_state == AdminState.ACTIVE


def test_action_on_a_node_that_cannot_exist(operator_client, db):
    response = operator_client.post("/nodes/a%00b/admin-state/", {"action": "cordon", "reason": "x"})
    assert response.status_code == 404


def test_viewer_cannot_act(viewer_client, cluster):
    response = viewer_client.post("/nodes/ready-1/admin-state/", {"action": "cordon", "reason": "x"})
    assert response.status_code == 403
    assert Node.objects.get(pk="ready-1").admin_state == AdminState.ACTIVE


def test_anonymous_cannot_act(client, cluster):
    response = client.post("/nodes/ready-1/admin-state/", {"action": "cordon", "reason": "x"})
    assert response.status_code == 302
    assert Node.objects.get(pk="ready-1").admin_state == AdminState.ACTIVE


@pytest.mark.parametrize("partial", [False, True])
def test_query_count_does_not_grow_with_the_fleet(viewer, client, redis_client, django_assert_num_queries, partial):
    client.force_login(viewer)
    extra = HTMX if partial else {}
    counts = []
    for size, prefix in ((10, "a"), (500, "b")):
        Node.objects.all().delete()
        make_fleet(size, prefix=prefix)
        # Session, user, the node, seven prefetches (GPUs, filesystems, fabrics, weights, installs,
        # allocations and their GPU claims), shard states; the whole page also asks for the user's
        # permissions. The events are the charts' (their own URL, tests/test_pages_history.py).
        with django_assert_num_queries(11 if partial else 13) as captured:
            assert client.get(f"/nodes/{prefix}00003/", **extra).status_code == 200
        counts.append(len(captured))
    assert counts[0] == counts[1]


def test_no_inline_script_so_a_strict_policy_holds(viewer_client, cluster, settings):
    settings.PROMETHEUS_URL = f"http://127.0.0.1:{free_port()}"
    for url in ("/nodes/ready-1/", "/nodes/ready-1/charts/"):
        html = viewer_client.get(url).content.decode()
        for tag in re.findall(r"<script[^>]*>", html):
            assert "src=" in tag or 'type="application/json"' in tag, tag
        assert " style=" not in html


def test_engines_show_the_state_placement_gave_their_shard(viewer_client, cluster, redis_client):
    deployment(name="llama", gpus_per_shard=2)
    reconcile()
    shard = Shard.objects.get()
    assert shard.node_id == "ready-1"
    html = viewer_client.get("/nodes/ready-1/", **HTMX).content.decode()
    row = re.search(rf"<tr>\s*<td><code>{shard.shard_id}</code>.*?</tr>", html, re.S).group(0)
    colour = REPLICA_COLOURS[ReplicaState(shard.state)]
    assert f'<span class="llmgw-badge llmgw-{colour}">{ReplicaState(shard.state).label}</span>' in row
    Shard.objects.filter(pk=shard.pk).update(state=ReplicaState.RUNNING)
    html = viewer_client.get("/nodes/ready-1/", **HTMX).content.decode()
    assert '<span class="llmgw-badge llmgw-green">running</span>' in html
