"""The node page's charts keep asking, whatever the last answer was, in a real Chromium.

htmx swaps in only a successful answer, and the first charts element used to be
triggered once, on load: one failed answer left "Loading history…" for good. The
browser's clock is Playwright's, so thirty seconds pass at once.
"""

from __future__ import annotations

import re

import pytest

from devstack.ports import free_port
from tests.browser.conftest import log_in

pytestmark = [pytest.mark.browser, pytest.mark.slow, pytest.mark.django_db(transaction=True)]

POLL_MS = 31_000


@pytest.fixture
def clocked_page(browser):
    """A tab whose timers the test moves; a script error fails the test. Failed loads
    are what this test provokes, so the console's reports of them are not errors here."""
    context = browser.new_context(viewport={"width": 1280, "height": 800})
    page = context.new_page()
    page.set_default_timeout(15_000)
    page.clock.install()
    script_errors: list[str] = []
    page.on("pageerror", lambda error: script_errors.append(str(error)))
    yield page
    context.close()
    assert not script_errors, script_errors


def test_charts_keep_polling_through_errors_and_recover(clocked_page, live_server, operator, cluster, settings):
    page = clocked_page
    # Nothing listens there: a healthy charts endpoint answers with a sentence about it.
    settings.PROMETHEUS_URL = f"http://127.0.0.1:{free_port()}"
    answer = {"how": "500"}
    asked = []

    def charts(route) -> None:
        asked.append(answer["how"])
        if answer["how"] == "500":
            route.fulfill(status=500, body="boom")
        elif answer["how"] == "unreachable":
            route.abort()
        else:
            route.continue_()

    # The charts URL carries the page's range (`?range=1h`).
    page.route(re.compile(r"/nodes/ready-1/charts/(\?|$)"), charts)
    log_in(page, live_server.url, "operator", "operator-pass", path="/nodes/ready-1/")
    failed = page.locator("#node-charts .charts-failed")
    failed.wait_for()
    assert "the server answered HTTP 500" in failed.inner_text()
    assert page.locator("#node-charts .charts-loading").count() == 0

    # The first element, never swapped, asks again thirty seconds later.
    answer["how"] = "served"
    page.clock.run_for(POLL_MS)
    page.locator("#node-charts .history-unavailable").wait_for()
    assert "not reachable" in page.locator("#node-charts .history-unavailable").inner_text()
    assert failed.count() == 0

    # The swapped-in answer polls on its own, and goes on after a failure too.
    answer["how"] = "unreachable"
    page.clock.run_for(POLL_MS)
    failed.wait_for()
    assert "could not be reached" in failed.inner_text()
    answer["how"] = "served"
    page.clock.run_for(POLL_MS)
    failed.wait_for(state="detached")
    assert asked == ["500", "served", "unreachable", "served"]
