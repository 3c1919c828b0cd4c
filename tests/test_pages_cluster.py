"""The cluster page `/` and its table partial."""

from __future__ import annotations

import re
import time

import pytest
from django.conf import settings
from django.utils import timezone

from agent.protocol import Load
from devstack.faults import redis_unreachable
from inventory.models import GPU, Node
from inventory.registration import upsert_inventory
from livestate import loadstore
from nodes import fleetload
from nodes.tasks import refresh_fleet_load
from tests.factories import make_fleet, make_inventory

HTMX = {"HTTP_HX_REQUEST": "true"}


def row_ids(html: str) -> list[str]:
    return re.findall(r'<tr id="node-([^"]+)"', html)


def load(cpu: float, used_gib: int = 100, available_gib: int = 412, load1: float = 1.0) -> Load:
    return Load(
        cpu_percent=cpu,
        cpus=192,
        load1=load1,
        memory_used_bytes=used_gib * 2**30,
        memory_available_bytes=available_gib * 2**30,
    )


@pytest.fixture
def viewer_client(client, viewer):
    client.force_login(viewer)
    return client


def test_anonymous_is_sent_to_login(client, db):
    response = client.get("/?sort=cpu")
    assert response.status_code == 302
    assert response["Location"] == f"{settings.LOGIN_URL}?next=/%3Fsort%3Dcpu"


def test_anonymous_poll_redirects_the_whole_page(client, db):
    response = client.get("/", HTTP_HX_REQUEST="true", HTTP_HX_CURRENT_URL="http://testserver/?state=lost")
    assert response.status_code == 200
    assert response["HX-Redirect"] == f"{settings.LOGIN_URL}?next=/%3Fstate%3Dlost"


def test_page_lists_every_node_with_its_state(viewer_client, cluster, redis_client):
    response = viewer_client.get("/")
    html = response.content.decode()
    assert response.status_code == 200
    assert sorted(row_ids(html)) == sorted(cluster)
    for name, node in cluster.items():
        row = re.search(rf'<tr id="node-{name}".*?</tr>', html, re.S).group(0)
        assert f'data-state="{node.state.value}"' in row
        assert f'href="/nodes/{name}/"' in row
    assert "hx-swap-oob" not in html
    assert "HX-Request" in response["Vary"]


def test_unreachable_and_lost_rows_stand_out(viewer_client, cluster, redis_client):
    html = viewer_client.get("/").content.decode()
    standing_out = re.findall(r'<tr id="node-([^"]+)" class="[^"]*stands-out', html)
    assert sorted(standing_out) == ["lost-1", "unreachable-1"]


def test_partial_comes_back_alone_with_the_summary_out_of_band(viewer_client, cluster, redis_client):
    response = viewer_client.get("/?sort=-hostname", **HTMX)
    html = response.content.decode()
    assert "<html" not in html and "<form" not in html
    assert html.lstrip().startswith('<section id="node-table"')
    assert 'hx-get="/?sort=-hostname"' in html
    assert re.search(r'<section id="cluster-summary"[^>]*hx-swap-oob="true"', html)
    assert sorted(row_ids(html)) == sorted(cluster)


def test_summary_counts_states_cores_memory_and_gpus(viewer_client, cluster, redis_client):
    now = time.time()
    loadstore.save("ready-1", load(50.0, used_gib=100, available_gib=412), now)
    loadstore.save("cordoned-1", load(25.0, used_gib=200, available_gib=312), now)
    html = viewer_client.get("/").content.decode()
    for state in ("ready", "cordoned", "unreachable", "lost"):
        assert f'data-count="{state}">1<' in html
    assert 'data-count="draining">0<' in html
    # 50 % and 25 % of 192 cores: 96 + 48 busy of 384.
    assert "144.0</span> of 384 cores busy" in html
    assert "300 GiB</span> of 1.0 TiB used" in html
    # 32 H100s, none claimed.
    assert re.search(r"H100-80GB</bdi></a> <span class=\"num\">32</span> of 32", html)


def test_cpu_and_ram_bars_carry_the_values(viewer_client, cluster, redis_client):
    loadstore.save("ready-1", load(42.4, used_gib=128, available_gib=384), time.time())
    html = viewer_client.get("/").content.decode()
    row = re.search(r'<tr id="node-ready-1".*?</tr>', html, re.S).group(0)
    assert re.search(r'<td class="cpu" data-percent="42.4">\s*<span class="bar"><span class="fill p42">', row)
    assert re.search(r'<td class="ram" data-percent="25.0"[^>]*>\s*<span class="bar"><span class="fill p25">', row)
    assert "42% · 81.4/192" in row
    assert "128 GiB / 512 GiB" in row
    assert "384 GiB avail." in row


def test_stale_load_is_shown_as_unknown_with_its_age(viewer_client, cluster, redis_client):
    stale_at = time.time() - settings.LLMGW_LOAD_MAX_AGE - 15
    loadstore.save("ready-1", load(77.0), stale_at)
    html = viewer_client.get("/").content.decode()
    row = re.search(r'<tr id="node-ready-1".*?</tr>', html, re.S).group(0)
    assert "77%" not in row
    assert re.search(r'<td class="cpu unknown stale" title="last load 7\d s old: too old to show">—</td>', row)


def test_redis_down_renders_from_the_database_and_says_load_is_unknown(viewer_client, cluster, settings):
    with redis_unreachable(settings):
        response = viewer_client.get("/")
    html = response.content.decode()
    assert response.status_code == 200
    assert sorted(row_ids(html)) == sorted(cluster)
    assert "Redis is not reachable, so current load is unknown" in html


@pytest.mark.parametrize(
    ("params", "expected"),
    [
        ("state=cordoned", ["cordoned-1"]),
        ("state=lost", ["lost-1"]),
        ("q=unreach", ["unreachable-1"]),
        ("q=LOST-1.EXAMPLE", ["lost-1"]),
        ("label=rack=r7", ["ready-1"]),
        ("label=rack", ["ready-1"]),
        ("gpu=A100-40GB", ["cordoned-1"]),
        ("gpu=A100-40GB&state=ready", []),
    ],
)
def test_filters(viewer_client, cluster, redis_client, params, expected):
    upsert_inventory("ready-1", make_inventory("ready-1.example", gpus=8, labels={"rack": "r7"}))
    upsert_inventory("cordoned-1", make_inventory("cordoned-1.example", gpus=2, gpu_name="NVIDIA A100-SXM4-40GB"))
    html = viewer_client.get(f"/?{params}").content.decode()
    assert sorted(row_ids(html)) == expected


def test_an_operator_label_wins_over_the_agents(viewer_client, cluster, redis_client):
    upsert_inventory("ready-1", make_inventory("ready-1.example", gpus=8, labels={"rack": "r7"}))
    Node.objects.filter(pk="ready-1").update(operator_labels={"rack": "r9"})
    assert row_ids(viewer_client.get("/?label=rack=r7").content.decode()) == []
    assert row_ids(viewer_client.get("/?label=rack=r9").content.decode()) == ["ready-1"]


def test_sort_by_the_database_columns(viewer_client, cluster, redis_client):
    by_hostname = row_ids(viewer_client.get("/?sort=-hostname").content.decode())
    assert by_hostname == sorted(cluster, reverse=True)
    by_state = row_ids(viewer_client.get("/?sort=state").content.decode())
    assert by_state == ["lost-1", "unreachable-1", "cordoned-1", "ready-1"]


def test_sort_by_load_puts_unknown_loads_last(viewer_client, cluster, redis_client):
    now = time.time()
    loadstore.save("ready-1", load(10.0), now)
    loadstore.save("cordoned-1", load(90.0), now)
    loadstore.save("unreachable-1", load(99.0), now - settings.LLMGW_LOAD_MAX_AGE - 1)
    ids = row_ids(viewer_client.get("/?sort=-cpu").content.decode())
    assert ids[:2] == ["cordoned-1", "ready-1"]
    assert sorted(ids[2:]) == ["lost-1", "unreachable-1"]
    assert row_ids(viewer_client.get("/?sort=cpu").content.decode())[:2] == ["ready-1", "cordoned-1"]


def test_sort_by_free_gpus(viewer_client, redis_client, db):
    make_fleet(3)  # each node: 8 GPUs, 0 to 3 claimed by its shard
    # n00001: two unhealthy, one of them claimed: 3 free. n00002: one unhealthy: 3 free as well.
    GPU.objects.filter(node_id="n00001", index__in=(3, 6)).update(health="ECC errors")
    GPU.objects.filter(node_id="n00002", index=7).update(health="lost")
    html = viewer_client.get("/?sort=gpus").content.decode()
    assert row_ids(html) == ["n00001", "n00002", "n00000"]
    assert re.search(r'<tr id="node-n00001".*?<td class="numeric gpus">3/8 ', html, re.S)
    assert row_ids(viewer_client.get("/?sort=-gpus").content.decode()) == ["n00000", "n00002", "n00001"]


def test_heartbeat_age_is_the_newer_of_the_row_and_the_load(viewer_client, cluster, redis_client):
    loadstore.save("unreachable-1", load(5.0), time.time() - 3)
    html = viewer_client.get("/").content.decode()
    assert re.search(r'<tr id="node-unreachable-1".*?<td class="numeric heartbeat">3 s</td>', html, re.S)
    assert re.search(r'<tr id="node-lost-1".*?<td class="numeric heartbeat">10 min</td>', html, re.S)


def test_sort_by_heartbeat_age(viewer_client, cluster, redis_client):
    youngest_first = ["ready-1", "cordoned-1", "unreachable-1", "lost-1"]
    Node.objects.filter(pk="cordoned-1").update(last_heartbeat=Node.objects.get(pk="ready-1").last_heartbeat)
    Node.objects.filter(pk="ready-1").update(last_heartbeat=timezone.now())
    assert row_ids(viewer_client.get("/?sort=heartbeat").content.decode()) == youngest_first
    assert row_ids(viewer_client.get("/?sort=-heartbeat").content.decode()) == youngest_first[::-1]


def test_pages_of_a_hundred(viewer_client, redis_client, db):
    ids = make_fleet(250, with_loads=False)
    first = row_ids(viewer_client.get("/").content.decode())
    third = viewer_client.get("/?page=3").content.decode()
    assert first == ids[:100]
    assert row_ids(third) == ids[200:]
    assert "page 3 of 3" in third
    assert row_ids(viewer_client.get("/?page=99").content.decode()) == ids[200:]
    # The pager's links keep the filter and sort.
    second = viewer_client.get("/?sort=-id&q=n00&page=2").content.decode()
    assert row_ids(second) == sorted(ids, reverse=True)[100:200]
    assert 'href="?sort=-id&amp;q=n00&amp;page=3"' in second
    assert 'href="?sort=-id&amp;q=n00&amp;page=1"' in second


@pytest.mark.parametrize(
    "query",
    [
        "sort=../../etc",
        "sort=-",
        "state=bogus",
        "label=a__b=c",
        "label==",
        "label=%00",
        "label=" + "x" * 5000,
        "gpu=%3Cx%3E",
        "page=-5",
        "page=abc",
        "page=99999999999999999999999",
        "q=%27%22%3B--",
    ],
)
def test_bad_input_never_fails(viewer_client, cluster, redis_client, query):
    assert viewer_client.get(f"/?{query}").status_code == 200
    assert viewer_client.get(f"/?{query}", **HTMX).status_code == 200


def test_markup_in_hostname_and_labels_is_shown_as_text(viewer_client, db, redis_client):
    upsert_inventory(
        "evil-1",
        make_inventory("<script>alert(1)</script>", labels={"note": "<img src=x onerror=alert(2)>"}),
    )
    html = viewer_client.get("/").content.decode()
    assert "<script>alert(1)</script>" not in html
    assert "<img src=x onerror=alert(2)>" not in html
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html
    assert "note=&lt;img src=x onerror=alert(2)&gt;" in html


@pytest.mark.parametrize("partial", [False, True])
def test_query_count_does_not_grow_with_the_fleet(viewer, client, redis_client, django_assert_num_queries, partial):
    client.force_login(viewer)
    extra = HTMX if partial else {}
    counts = []
    for size, prefix in ((10, "a"), (500, "b")):
        Node.objects.all().delete()
        make_fleet(size, prefix=prefix)
        for url in ("/", "/?sort=-cpu&state=ready", "/?sort=gpus&label=zone=a&gpu=H100-80GB"):
            # Session, user, states, count (or the matching ids when sorting by load), the page and
            # four prefetches; when the shared fleet figures are missing, also the ids and the GPUs;
            # the whole page (not its refresh) also lists the served models.
            models = 0 if partial else 1
            fleetload.forget()
            with django_assert_num_queries(11 + models) as computing:
                assert client.get(url, **extra).status_code == 200
            with django_assert_num_queries(9 + models) as shared:
                assert client.get(url, **extra).status_code == 200
            counts.append((len(computing), len(shared)))
    assert counts[:3] == counts[3:]


def test_fleet_totals_are_shared_for_a_refresh_period(viewer_client, cluster, redis_client):
    loadstore.save("ready-1", load(50.0), time.time())
    assert "96.0</span> of 192 cores busy" in viewer_client.get("/").content.decode()
    loadstore.save("cordoned-1", load(50.0), time.time())
    assert "96.0</span> of 192 cores busy" in viewer_client.get("/").content.decode()
    ttl = redis_client.pttl(fleetload.TOTALS_KEY)
    assert 0 < ttl <= fleetload.shared_seconds() * 1000
    fleetload.forget()
    assert "192.0</span> of 384 cores busy" in viewer_client.get("/").content.decode()


def test_no_inline_script_so_a_strict_policy_holds(viewer_client, cluster, redis_client):
    response = viewer_client.get("/")
    assert "script-src 'self'" in response["Content-Security-Policy"]
    html = response.content.decode()
    for tag in re.findall(r"<script[^>]*>", html):
        assert "src=" in tag, tag
    assert " style=" not in html


def test_celery_beat_computes_the_fleet_figures_within_the_pages_refresh(
    viewer, client, cluster, redis_client, settings, django_assert_num_queries
):
    entry = settings.CELERY_BEAT_SCHEDULE["refresh-fleet-load"]
    assert entry["task"] == refresh_fleet_load.name
    assert entry["schedule"] == settings.LLMGW_FLEET_LOAD_PERIOD
    assert fleetload.shared_seconds() > settings.LLMGW_FLEET_LOAD_PERIOD
    loadstore.save("ready-1", load(50.0), time.time())
    fleetload.forget()
    assert refresh_fleet_load() == 1
    client.force_login(viewer)
    # Neither the summary nor the sort by load reads the fleet's ids or GPUs: the task did
    # (the whole page's tenth query lists the served models).
    with django_assert_num_queries(10):
        html = client.get("/?sort=-cpu").content.decode()
    assert "96.0</span> of 192 cores busy" in html
    assert row_ids(html)[0] == "ready-1"


def test_a_table_sorted_by_load_keeps_the_order_of_the_last_computation_and_shows_current_loads(
    viewer_client, cluster, redis_client
):
    now = time.time()
    loadstore.save("ready-1", load(10.0), now)
    loadstore.save("cordoned-1", load(90.0), now)
    assert row_ids(viewer_client.get("/?sort=-cpu").content.decode())[:2] == ["cordoned-1", "ready-1"]
    loadstore.save("ready-1", load(95.0), now)
    html = viewer_client.get("/?sort=-cpu").content.decode()
    assert row_ids(html)[:2] == ["cordoned-1", "ready-1"]
    assert "95%" in html
    refresh_fleet_load()
    assert row_ids(viewer_client.get("/?sort=-cpu").content.decode())[:2] == ["ready-1", "cordoned-1"]
