"""The tenant pages in a real Chromium: the budget meters as a screen reader gets them, the usage
refreshing in place, the charts drawn from a real Prometheus scraping the gateway's own metrics,
and no axe-core violation of any impact on the list and the tenant's page, light and dark."""

from __future__ import annotations

import pytest
from django.utils import timezone
from playwright.sync_api import expect

from devstack.polling import wait_until
from gateway import usage
from gateway.counted import Counted
from gateway.models import ApiKey, Tenant
from tests.browser.conftest import log_in
from tests.browser.test_accessibility import violations
from tests.prometheus import PrometheusServer
from tests.test_pages_tenants import GatewayExposition

pytestmark = [pytest.mark.browser, pytest.mark.slow, pytest.mark.django_db(transaction=True)]


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory):
    exposition = GatewayExposition().start()
    server = PrometheusServer(tmp_path_factory.mktemp("prometheus"), f"127.0.0.1:{exposition.port}")
    server.start()
    wait_until(lambda: server.samples('llmgw_gateway_prompt_tokens_total{tenant="acme"}') >= 4, 60, "usage scraped")
    yield server
    server.stop()
    exposition.stop()


@pytest.mark.parametrize("scheme", ["light", "dark"])
def test_the_tenant_pages_show_usage_against_the_budget_and_have_no_violation(
    page, live_server, operator, settings, prometheus, scheme
):
    settings.PROMETHEUS_URL = prometheus.url
    acme = Tenant.objects.create(name="acme", tokens_per_day=1_000, tokens_per_minute=500, concurrent_requests=4)
    Tenant.objects.create(name="held", tokens_per_day=0, active=False)
    for name, revoked in (("<script>alert(1)</script>", False), ("old service", True)):
        key = ApiKey(tenant=acme, name=name)
        key.issue()
        key.save()
        if revoked:
            key.revoke(by="alice")
    usage.record({("acme", "chat", "chat-r1"): Counted(2, 100, 150), ("acme", "<b>x</b>", "r2"): Counted(1, 0, 50)})
    page.emulate_media(color_scheme=scheme)
    log_in(page, live_server.url, "operator", "operator-pass", "/tenants/")
    page.locator("#link-acme").wait_for()
    found = {"tenants": violations(page)}

    page.click("#link-acme")
    page.wait_for_url(live_server.url + "/tenants/acme/")
    today = page.get_by_role("meter", name="Tokens today")
    assert today.get_attribute("aria-valuetext") == "300 of 1,000 tokens"
    assert today.locator(".fill").evaluate("e => e.getBoundingClientRect().width") == pytest.approx(
        0.3 * today.evaluate("e => e.getBoundingClientRect().width"), abs=1
    )
    assert page.locator("table.keys").inner_text().count("<script>alert(1)</script>") == 1
    tokens = page.locator('.chart[data-key="tokens"][data-drawn="true"]')
    tokens.wait_for()
    assert tokens.locator(".u-legend .u-series").nth(1).locator(".u-label").inner_text() == "chat"
    page.locator('.chart[data-key="per_minute"][data-drawn="true"]').wait_for()
    found["tenant"] = violations(page)

    # More usage recorded: the page shows it without a reload, and then spent, over budget.
    page.evaluate("window.__notReloaded = 'still here'")
    usage.record({("acme", "chat", "chat-r1"): Counted(1, 500, 200)}, now=timezone.now())
    expect(page.locator("#budget-day .used")).to_have_text("1,000", timeout=15_000)
    assert page.locator("p.over-budget").inner_text().startswith("Over budget now: the tokens per day budget")
    assert page.evaluate("window.__notReloaded") == "still here"
    found["over budget"] = violations(page)
    assert found == {"tenants": [], "tenant": [], "over budget": []}
