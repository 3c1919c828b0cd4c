"""The model page in a real Chromium: its charts drawn from a real Prometheus evaluating the gateway rules,
the in-flight chart's series named by replica, and no serious axe-core violation, light and dark."""

from __future__ import annotations

import pytest

from devstack.polling import wait_until
from inventory.models import Deployment
from tests.browser.conftest import log_in
from tests.browser.test_accessibility import violations
from tests.factories import place
from tests.prometheus import PrometheusServer
from tests.test_pages_models import RULES, GrowingExposition

pytestmark = [pytest.mark.browser, pytest.mark.slow, pytest.mark.django_db(transaction=True)]


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory):
    exposition = GrowingExposition().start()
    server = PrometheusServer(tmp_path_factory.mktemp("prometheus"), f"127.0.0.1:{exposition.port}", rules=RULES)
    server.start()
    wait_until(lambda: server.samples("llmgw:model_ttft_seconds:p99") >= 2, 60, "time to first token recorded")
    yield server
    server.stop()
    exposition.stop()


@pytest.mark.parametrize("scheme", ["light", "dark"])
def test_the_model_page_draws_its_charts_and_has_no_serious_violation(
    page, live_server, operator, cluster, settings, prometheus, scheme
):
    settings.PROMETHEUS_URL = prometheus.url
    replica = place("chat", {"ready-1": [0]}, model="org/chat")
    assert Deployment.objects.get(pk=replica.deployment_id).served_model_name == "chat"
    page.emulate_media(color_scheme=scheme)
    log_in(page, live_server.url, "operator", "operator-pass")
    page.goto(live_server.url + "/models/chat/")
    in_flight = page.locator('.chart[data-key="in_flight"][data-drawn="true"]')
    in_flight.wait_for()
    assert in_flight.locator(".u-legend .u-series").nth(1).locator(".u-label").inner_text() == "chat-r1"
    assert in_flight.get_attribute("data-points") not in (None, "0")
    page.locator('.chart[data-key="ttft"][data-drawn="true"]').wait_for()
    assert violations(page) == [], "model page"
