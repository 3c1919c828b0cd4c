"""axe-core in a real Chromium: no violation of any impact on the login, cluster and node pages, light and dark.

axe-core is vendored (`static/vendor/axe-core/`), so the test runs offline; it is
evaluated in the page by Playwright, which the page's CSP does not govern.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import requests

from devstack.polling import wait_until
from inventory.models import NodeEvent
from nodes import promalerts
from tests.browser.conftest import log_in
from tests.prometheus import ExpositionServer, PrometheusServer

pytestmark = [pytest.mark.browser, pytest.mark.slow, pytest.mark.django_db(transaction=True)]

AXE = Path(__file__).resolve().parents[2] / "static" / "vendor" / "axe-core" / "axe.min.js"
RULES = Path(__file__).resolve().parents[2] / "deploy" / "rules" / "llmgw.rules.yml"


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory):
    """lost-1 has history and a firing alert, so the node page shows everything it can."""
    exposition = ExpositionServer(
        'llmgw_node_state{node="lost-1",state="lost"} 1\n'
        'llmgw_node_cpu_utilization_percent{node="lost-1"} 12.5\n'
        'llmgw_node_load{node="lost-1",window="1m"} 0.5\n'
    ).start()
    server = PrometheusServer(tmp_path_factory.mktemp("prometheus"), f"127.0.0.1:{exposition.port}", rules=RULES)
    server.start()

    def fires() -> bool:
        alerts = requests.get(f"{server.url}/api/v1/alerts", timeout=2).json()["data"]["alerts"]
        return any(a["state"] == "firing" for a in alerts)

    wait_until(fires, 30, "LLMGWNodeLost to fire")
    yield server
    server.stop()
    exposition.stop()


def violations(page) -> list[str]:
    """Each violation, whatever its impact, as `rule (impact): where`, for a readable failure.

    A moderate one (a page without a heading, two landmarks of one name) is still a
    page a screen reader's user finds their way around less well.
    """
    page.evaluate(AXE.read_text())
    found = page.evaluate("async () => (await axe.run(document)).violations")
    return [f"{v['id']} ({v['impact']}): {', '.join(str(n['target']) for n in v['nodes'][:5])}" for v in found]


@pytest.mark.parametrize("scheme", ["light", "dark"])
def test_no_violation_on_login_cluster_and_node_pages(
    page, live_server, operator, cluster, settings, prometheus, scheme
):
    settings.PROMETHEUS_URL = prometheus.url
    promalerts.cache.clear()
    NodeEvent.objects.create(node=cluster["lost-1"], kind="liveness", from_state="alive", to_state="lost")
    page.emulate_media(color_scheme=scheme)
    page.goto(live_server.url + "/admin/login/")
    found = {"login": violations(page)}

    log_in(page, live_server.url, "operator", "operator-pass")
    page.locator("#node-table").wait_for()
    found["cluster"] = violations(page)

    page.goto(live_server.url + "/nodes/lost-1/")
    assert page.locator("#node-live .alerts").inner_text().count("LLMGWNodeLost") == 1
    # The charts section answers after the page: check the page as the reader sees it then,
    # with an event's marker under the mouse.
    marker = page.locator('.chart[data-key="cpu"] .event-marker')
    marker.wait_for()
    marker.scroll_into_view_if_needed()
    marker.hover()
    found["node"] = violations(page)
    assert found == {"login": [], "cluster": [], "node": []}
