"""The tenant pages: a tenant's usage against its budget, from the rows the gateway's sync records.

Usage is recorded through gateway.usage.record, as the sync records it; the page's figures are
checked against sums computed here from what was recorded, its over-budget state against
gateway.budgets.spent(), and its charts against a real Prometheus scraping the gateway's own
metrics class (gateway/metrics.py).
"""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime, timedelta

import pytest
import time_machine
from django.contrib.auth.models import Permission
from prometheus_client import generate_latest

from devstack.polling import wait_until
from devstack.ports import free_port
from gateway import budgets, usage
from gateway.counted import Counted
from gateway.metrics import GatewayMetrics
from gateway.models import ApiKey, Tenant
from inventory.models import Deployment
from tests.factories import place
from tests.prometheus import ExpositionServer, PrometheusServer
from tests.test_security_pages import _tags_only

pytestmark = pytest.mark.django_db

HTMX = {"HTTP_HX_REQUEST": "true"}
NOW = datetime(2026, 12, 2, 10, 20, 30, tzinfo=UTC)
HOSTILE = "<script>alert(1)</script>"

# (when, model, replica, requests, prompt, completion): two hours today, one yesterday before
# midnight UTC (in the last 24 h, not today), one in the hour that began 24 h ago (the first the
# tables cover), one in the hour before it (in neither).
RECORDED = [
    (datetime(2026, 12, 2, 9, 10, tzinfo=UTC), "chat", "chat-r1", 3, 100, 50),
    (datetime(2026, 12, 2, 10, 5, tzinfo=UTC), "chat", "chat-r1", 2, 30, 20),
    (datetime(2026, 12, 2, 10, 6, tzinfo=UTC), "chat", "chat-r2", 1, 7, 8),
    (datetime(2026, 12, 2, 10, 20, 10, tzinfo=UTC), "code", "code-r1", 1, 40, 2),
    (datetime(2026, 12, 1, 23, 59, 50, tzinfo=UTC), "chat", "chat-r1", 5, 500, 400),
    (datetime(2026, 12, 1, 10, 30, tzinfo=UTC), "chat", "chat-r1", 1, 11, 12),
    (datetime(2026, 12, 1, 9, 59, tzinfo=UTC), "chat", "chat-r1", 9, 900, 900),
]


def record(tenant: str, rows=RECORDED) -> None:
    for at, model, replica, requests, prompt, completion in rows:
        usage.record({(tenant, model, replica): Counted(requests, prompt, completion)}, now=at)


def tokens(rows) -> int:
    return sum(prompt + completion for _, _, _, _, prompt, completion in rows)


def figures(html: str, css_class: str) -> str:
    return re.search(rf'<span class="[^"]*\b{css_class}\b[^"]*">([^<]*)</span>', html).group(1)


def card(html: str, key: str) -> str:
    return re.search(rf'<div class="card budget" id="budget-{key}">.*?\n</div>', html, re.S).group(0)


def number(text: str) -> int:
    return int(text.replace(",", ""))


def cells(row: str) -> dict[str, int]:
    return {name: number(value) for name, value in re.findall(r'<td class="numeric (\w+)">([\d,]+)</td>', row)}


@pytest.fixture
def viewer_client(client, viewer):
    viewer.user_permissions.add(Permission.objects.get(codename="view_tenant", content_type__app_label="gateway"))
    client.force_login(viewer)
    return client


def test_a_user_without_the_view_tenant_permission_gets_403(client, viewer, acme):
    # The admin would not show this user tenants either: the pages show no more than its permissions allow.
    client.force_login(viewer)
    for path in ("/tenants/", "/tenants/acme/", "/tenants/acme/charts/"):
        assert client.get(path).status_code == 403, path


@pytest.fixture
def at_now():
    with time_machine.travel(NOW, tick=False):
        yield


@pytest.fixture
def acme(db):
    return Tenant.objects.create(name="acme", tokens_per_day=5_000, tokens_per_minute=100, requests_per_second=20)


def test_tokens_today_count_from_midnight_utc_and_this_minute_from_its_start(viewer_client, acme, at_now):
    record("acme")
    today = [row for row in RECORDED if row[0] >= NOW.replace(hour=0, minute=0, second=0)]
    assert len(today) == 4  # the row from 23:59:50 yesterday is not today's
    html = viewer_client.get("/tenants/acme/").content.decode()
    day = card(html, "day")
    assert number(figures(day, "used")) == tokens(today) == 257
    assert figures(day, "limit") == "5,000"
    assert f'aria-valuenow="{tokens(today)}"' in day and 'aria-valuemax="5000"' in day
    assert 'role="meter"' in day and 'aria-labelledby="budget-day-label"' in day
    assert figures(day, "percent") == f"({round(100 * tokens(today) / 5000)} %)"
    # Only the row recorded in 10:20 counts for this minute.
    minute = card(html, "minute")
    assert number(figures(minute, "used")) == 42
    assert "since 10:20 UTC" in minute
    assert 'class="llmgw-badge llmgw-blue budget-state">within budget' in html


def test_usage_of_the_last_24_hours_by_model_replica_and_hour(viewer_client, acme, at_now):
    record("acme")
    record("other")  # another tenant's usage is not acme's
    since = datetime(2026, 12, 1, 10, 0, tzinfo=UTC)
    window = [row for row in RECORDED if row[0] >= since]
    html = viewer_client.get("/tenants/acme/").content.decode()
    assert "Usage since 2026-12-01 10:00 UTC" in html
    table = re.search(r'<table class="usage-by-replica".*?</table>', html, re.S).group(0)
    rows = re.findall(r"<tr><td>(.*?)</td><td><bdi>(.*?)</bdi></td>(.*?)</tr>", table, re.S)
    found = {(re.sub(r"<[^>]+>", "", model), replica): cells(rest) for model, replica, rest in rows}
    expected: dict[tuple[str, str], dict[str, int]] = {}
    for _, model, replica, requests, prompt, completion in window:
        sums = expected.setdefault((model, replica), dict.fromkeys(("requests", "prompt", "completion", "tokens"), 0))
        for name, value in (("requests", requests), ("prompt", prompt), ("completion", completion)):
            sums[name] += value
        sums["tokens"] += prompt + completion
    assert found == expected
    # chat-r1: two of today's hours, yesterday's 23:00 and 10:30, summed; the row from 09:59 yesterday left out.
    assert found[("chat", "chat-r1")] == {"requests": 11, "prompt": 641, "completion": 482, "tokens": 1123}
    total = re.search(r'<p class="usage-total">(.*?)</p>', html, re.S).group(1)
    assert number(re.search(r'<span class="num">([\d,]+)</span>', total).group(1)) == tokens(window)

    hours = dict(re.findall(r'<tr id="hour-(\d{8}-\d\d)"[^>]*>(.*?)</tr>', html, re.S))
    assert len(hours) == 25
    assert list(hours)[::24] == ["20261202-10", "20261201-10"]  # newest first, back to the hour 24 h ago
    ten = [row for row in window if row[0] >= datetime(2026, 12, 2, 10, tzinfo=UTC)]
    assert cells(hours["20261202-10"]) == {
        "requests": sum(row[3] for row in ten),
        "prompt": sum(row[4] for row in ten),
        "completion": sum(row[5] for row in ten),
        "tokens": tokens(ten),
    }
    assert cells(hours["20261201-23"])["tokens"] == 900
    assert cells(hours["20261201-10"])["tokens"] == 23
    assert cells(hours["20261202-08"])["tokens"] == 0
    # The busiest hour's bar is full.
    assert 'class="fill p100"' in hours["20261201-23"]


@pytest.mark.parametrize(
    ("limits", "active", "rows"),
    [
        pytest.param({"tokens_per_day": 5_000, "tokens_per_minute": 100}, True, RECORDED, id="within"),
        pytest.param({"tokens_per_day": 257}, True, RECORDED, id="day-spent-exactly"),
        pytest.param({"tokens_per_day": 258}, True, RECORDED, id="day-one-short"),
        pytest.param({"tokens_per_minute": 42}, True, RECORDED, id="minute-spent"),
        pytest.param({"tokens_per_day": 0}, True, [], id="zero-budget"),
        pytest.param({"tokens_per_day": 10}, False, RECORDED, id="inactive"),
        pytest.param({}, True, RECORDED, id="no-budget"),
    ],
)
def test_over_budget_agrees_with_what_the_gateway_refuses(viewer_client, at_now, limits, active, rows):
    Tenant.objects.create(name="acme", active=active, **limits)
    record("acme", rows)
    refused = budgets.spent()
    html = viewer_client.get("/tenants/acme/").content.decode()
    listed = viewer_client.get("/tenants/").content.decode()
    row = re.search(r'<tr id="tenant-acme">.*?</tr>', listed, re.S).group(0)
    assert ("Over budget now" in html) == ("acme" in refused)
    assert ('budget-state">over budget' in html) == ("acme" in refused)
    assert (">over budget<" in row) == ("acme" in refused)
    if "acme" in refused:
        window, limit, _ = refused["acme"].split(":")
        assert f"the tokens per {window} budget of {int(limit):,} is spent" in html
    if not active:
        assert "Inactive: the gateway refuses every key of this tenant." in html and ">inactive<" in row


def test_a_zero_budget_says_every_request_is_refused(viewer_client, at_now):
    Tenant.objects.create(name="held", tokens_per_day=0, requests_per_second=0)
    html = viewer_client.get("/tenants/held/").content.decode()
    assert 'budget 0: <span class="bad">every request refused</span>' in card(html, "day")
    assert '<dd id="limit-rps"><span class="bad">0: every request refused</span>' in html
    assert '<dd id="limit-concurrent"><span class="muted">no limit</span>' in html


def test_keys_show_prefix_and_state_never_the_secret(viewer_client, acme, at_now):
    made = {}
    for name, expires, revoke in (
        ("live", None, False),
        ("old", NOW - timedelta(days=1), False),
        ("gone", None, True),
        ("later", NOW + timedelta(days=3), False),
    ):
        key = ApiKey(tenant=acme, name=name, expires_at=expires)
        made[name] = (key.issue(), key)
        key.save()
        if revoke:
            key.revoke(by="alice")
    html = viewer_client.get("/tenants/acme/").content.decode()
    for secret, key in made.values():
        assert secret not in html and key.digest not in html
        assert f"<code>{key.prefix}…</code>" in html
    states = dict(re.findall(r'<tr class="key key-[a-z-]+">.*?<bdi>(\w+)</bdi></td><td>([a-z ]+)</td>', html, re.S))
    assert states == {"live": "usable", "old": "expired", "gone": "revoked", "later": "usable"}
    assert "by <bdi>alice</bdi>" in html
    listed = viewer_client.get("/tenants/").content.decode()
    assert re.search(r'<td class="numeric keys">2 <span class="muted">of 4</span></td>', listed)


def test_names_from_users_are_escaped(viewer_client, at_now):
    # A tenant's name keeps to a safe alphabet; key names, models and replicas as recorded do not.
    Tenant.objects.create(name="a.b_c-9", tokens_per_day=1)
    tenant = Tenant.objects.get(name="a.b_c-9")
    key = ApiKey(tenant=tenant, name=HOSTILE)
    key.issue()
    key.save()
    record("a.b_c-9", [(NOW, HOSTILE, '"><img src=x onerror=alert(2)>', 1, 1, 1)])
    for path, htmx in (("/tenants/a.b_c-9/", False), ("/tenants/a.b_c-9/", True), ("/tenants/", False)):
        html = viewer_client.get(path, **(HTMX if htmx else {})).content.decode()
        assert "<script>alert" not in html and "<img src=x" not in html, path
    html = viewer_client.get("/tenants/a.b_c-9/").content.decode()
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html
    assert "&quot;&gt;&lt;img src=x onerror=alert(2)&gt;" in html
    assert "<h1><bdi>a.b_c-9</bdi>" in html


def test_a_model_still_served_links_to_its_page(viewer_client, acme, cluster, at_now):
    replica = place("chat", {"ready-1": [0]})
    assert Deployment.objects.get(pk=replica.deployment_id).served_model_name == "chat"
    record("acme")
    html = viewer_client.get("/tenants/acme/").content.decode()
    assert '<a href="/models/chat/"><bdi>chat</bdi></a>' in html
    # `code` has no deployment now: its usage is shown, not linked.
    assert "<td><bdi>code</bdi></td>" in html


def test_an_unknown_tenant_is_404_and_its_refresh_stops_polling(viewer_client, acme):
    assert viewer_client.get("/tenants/nope/").status_code == 404
    assert viewer_client.get("/tenants/nope/charts/").status_code == 404
    assert viewer_client.get("/tenants/nope/", **HTMX).status_code == 286
    assert viewer_client.get("/tenants/nope/charts/", **HTMX).status_code == 286


def test_a_range_the_page_does_not_offer_is_refused_by_name(viewer_client, acme):
    answer = viewer_client.get("/tenants/acme/charts/?range=1y", **HTMX)
    assert answer.status_code == 400
    assert answer.content.decode().startswith("range: must be one of")
    # On the page, the range falls back, as the other pages' do.
    html = viewer_client.get("/tenants/acme/?range=2d").content.decode()
    assert "range: &#x27;2d&#x27; is not one of 1h, 6h, 24h, 7d; showing 1 h." in html


def test_the_tenant_pages_need_a_login(client, acme):
    for path in ("/tenants/", "/tenants/acme/", "/tenants/acme/charts/"):
        answer = client.get(path)
        assert answer.status_code == 302 and "/login" in answer["Location"], path
        assert "acme" not in client.get(path, **HTMX).content.decode()


def test_the_live_parts_refresh_alone(viewer_client, acme):
    live = viewer_client.get("/tenants/acme/", **HTMX)
    assert live.content.decode().lstrip().startswith('<section id="tenant-live"') and b"<html" not in live.content
    assert "HX-Request" in live["Vary"]
    listed = viewer_client.get("/tenants/", **HTMX).content.decode()
    assert listed.lstrip().startswith('<section id="tenant-table"') and "<html" not in listed


def test_the_cluster_page_and_the_top_bar_link_to_the_tenants(viewer_client, acme):
    html = viewer_client.get("/").content.decode()
    assert '<a id="tenants-link" href="/tenants/">' in html
    assert '<nav aria-label="site">' in html and '<a href="/tenants/">Tenants</a>' in html
    listed = viewer_client.get("/tenants/").content.decode()
    assert '<a id="link-acme" href="/tenants/acme/"><bdi>acme</bdi></a>' in listed


def test_the_list_shows_100_tenants_a_page_and_its_refresh_keeps_the_page(viewer_client, at_now):
    Tenant.objects.bulk_create(Tenant(name=f"t{i:03d}") for i in range(205))
    usage.record({("t201", "chat", "r1"): Counted(1, 5, 6)})

    def shown(query: str, **extra) -> list[str]:
        return re.findall(r'<tr id="tenant-(t\d+)">', viewer_client.get(f"/tenants/{query}", **extra).content.decode())

    assert shown("") == [f"t{i:03d}" for i in range(100)]
    third = viewer_client.get("/tenants/?page=3").content.decode()
    assert shown("?page=3") == ["t200", "t201", "t202", "t203", "t204"]
    assert "205 tenants · page 3 of 3" in third
    assert 'id="page-prev" href="?page=2"' in third and "page-next" not in third
    assert 'hx-get="/tenants/?page=3"' in third
    assert re.search(r'<tr id="tenant-t201">.*?<span class="used">11</span>', third, re.S)
    assert shown("?page=3", **HTMX) == shown("?page=99") == shown("?page=3")
    for malformed in ("x", "-2", "0", "²", "1" * 5000):
        assert shown(f"?page={malformed}")[0] == ("t200" if malformed == "1" * 5000 else "t000"), malformed


def _load(name: str, keys: int, models: int) -> None:
    tenant = Tenant.objects.create(name=name, tokens_per_day=10**6, tokens_per_minute=10**4)
    for i in range(keys):
        key = ApiKey(tenant=tenant, name=f"k{i}")
        key.issue()
        key.save()
    for hour in range(25):
        at = NOW - timedelta(hours=hour)
        usage.record({(name, f"m{i}", f"m{i}-r1"): Counted(1, 2, 3) for i in range(models)}, now=at)


@pytest.mark.parametrize("path", ["/tenants/{}/", "/tenants/"])
@pytest.mark.parametrize("htmx", [False, True])
def test_query_count_does_not_grow_with_keys_models_hours_or_tenants(
    viewer_client, at_now, django_assert_num_queries, path, htmx
):
    _load("small", keys=1, models=1)
    counts = []
    for name, keys, models, others in (("small", 1, 1, 0), ("big", 30, 12, 20)):
        if name == "big":
            _load("big", keys, models)
            for i in range(others):
                _load(f"t{i}", keys=2, models=1)
        # Session and user, then the page's own: the tenant, its minute and day, keys, usage by replica and by
        # hour, the models still served; the list's: the count, a page of tenants with their keys counted, the
        # minute and the day; and the user's permissions (two, then cached for the request), asked by the view
        # tenant check on every answer and by the whole page's link to the admin.
        expected = (7 if "{}" in path else 4) + 2 + 2
        with django_assert_num_queries(expected) as captured:
            answer = viewer_client.get(path.format(name), **(HTMX if htmx else {}))
        assert answer.status_code == 200
        counts.append(len(captured))
    assert counts[0] == counts[1]


class GatewayExposition(ExpositionServer):
    """The gateway sync's own metrics (gateway/metrics.py), one answer of acme's counted before each scrape."""

    def __init__(self):
        super().__init__()
        self.metrics = GatewayMetrics()

    @property
    def text(self) -> str:
        self.metrics.taken({("acme", "chat", "chat-r1"): Counted(1, 10, 20)})
        self.metrics.taken({("other", "chat", "chat-r1"): Counted(1, 1000, 1000)})
        return generate_latest(self.metrics.registry).decode()

    @text.setter
    def text(self, value: str) -> None:
        pass


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory):
    exposition = GatewayExposition().start()
    server = PrometheusServer(tmp_path_factory.mktemp("prometheus"), f"127.0.0.1:{exposition.port}")
    server.start()
    wait_until(lambda: server.samples('llmgw_gateway_prompt_tokens_total{tenant="acme"}') >= 4, 60, "usage scraped")
    yield server
    server.stop()
    exposition.stop()


def chart_data(html: str) -> dict:
    return json.loads(re.search(r'<script id="chart-data" type="application/json">(.*?)</script>', html).group(1))


def test_the_charts_draw_the_tenants_tokens_from_prometheus(viewer_client, acme, settings, prometheus):
    settings.PROMETHEUS_URL = prometheus.url
    html = viewer_client.get("/tenants/acme/charts/?range=1h", **HTMX).content.decode()
    charts = {chart["key"]: chart for chart in chart_data(html)["charts"]}
    assert charts["tokens"]["series"] == ["chat"]
    assert charts["requests"]["series"] == ["chat"]
    kinds = dict(zip(charts["kinds"]["series"], (column[-1] for column in charts["kinds"]["values"]), strict=True))
    # Each scrape adds 10 prompt and 20 completion tokens of acme's (another tenant's are not acme's).
    assert kinds["prompt"] > 0 and kinds["completion"] == pytest.approx(2 * kinds["prompt"])
    assert charts["tokens"]["values"][0][-1] == pytest.approx(kinds["prompt"] + kinds["completion"])
    per_minute = dict(
        zip(charts["per_minute"]["series"], (column[-1] for column in charts["per_minute"]["values"]), strict=True)
    )
    assert per_minute["budget"] == 100
    assert per_minute["tokens/min"] == pytest.approx(60 * (kinds["prompt"] + kinds["completion"]))


def test_without_prometheus_the_charts_say_why_and_the_page_still_shows_usage(viewer_client, acme, settings, at_now):
    settings.PROMETHEUS_URL = f"http://127.0.0.1:{free_port()}"
    record("acme")
    charts = viewer_client.get("/tenants/acme/charts/", **HTMX).content.decode()
    assert "History is unavailable: Prometheus at http://127.0.0.1:" in charts
    html = viewer_client.get("/tenants/acme/").content.decode()
    assert number(figures(card(html, "day"), "used")) == 257


@pytest.mark.parametrize("path", ["/tenants/", "/tenants/acme/"])
def test_the_tenant_pages_carry_no_inline_script_or_style(viewer_client, acme, path):
    record("acme", [(NOW, HOSTILE, HOSTILE, 1, 1, 1)])
    response = viewer_client.get(path)
    assert response["Content-Security-Policy"] and response["X-Frame-Options"] == "DENY"
    body = response.content.decode()
    for tag in re.findall(r"<script[^>]*>", body):
        assert "src=" in tag, tag
    assert not re.search(r"\son[a-z]+\s*=|\sstyle\s*=", _tags_only(body)), "an inline handler or style"
