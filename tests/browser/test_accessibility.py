"""axe-core in a real Chromium: no serious or critical violation on the login, cluster and node pages, light and dark.

axe-core is vendored (`static/vendor/axe-core/`), so the test runs offline; it is
evaluated in the page by Playwright, which the page's CSP does not govern.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.browser.conftest import log_in

pytestmark = [pytest.mark.browser, pytest.mark.slow, pytest.mark.django_db(transaction=True)]

AXE = Path(__file__).resolve().parents[2] / "static" / "vendor" / "axe-core" / "axe.min.js"
BLOCKING = {"serious", "critical"}


def violations(page) -> list[str]:
    """Each serious or critical violation as `rule (impact): where`, for a readable failure."""
    page.evaluate(AXE.read_text())
    found = page.evaluate("async () => (await axe.run(document)).violations")
    return [
        f"{v['id']} ({v['impact']}): {', '.join(str(n['target']) for n in v['nodes'][:5])}"
        for v in found
        if v["impact"] in BLOCKING
    ]


@pytest.mark.parametrize("scheme", ["light", "dark"])
def test_no_serious_violation_on_login_cluster_and_node_pages(page, live_server, operator, cluster, scheme):
    page.emulate_media(color_scheme=scheme)
    page.goto(live_server.url + "/admin/login/")
    assert violations(page) == [], "login page"

    log_in(page, live_server.url, "operator", "operator-pass")
    page.locator("#node-table").wait_for()
    assert violations(page) == [], "cluster page"

    page.goto(live_server.url + "/nodes/cordoned-1/")
    # The charts section answers after the page: check the page as the reader sees it then.
    page.locator("#node-charts .chart-events").wait_for()
    assert violations(page) == [], "node page"
