"""Real-browser tests: Debian's chromium, driven by the playwright package, against a live server.

Never `playwright install`: it downloads a browser, which fails offline. The
system chromium comes from `scripts/system-packages --with-browser`.
"""

from __future__ import annotations

import shutil

import pytest

from devstack.chromium import CHROMIUM, CHROMIUM_ARGS


@pytest.fixture(scope="module")
def browser():
    from playwright.sync_api import sync_playwright

    if not shutil.which(CHROMIUM):
        pytest.fail(f"{CHROMIUM} is missing: run scripts/system-packages --with-browser (apt-get install chromium)")
    # Playwright's synchronous API runs an event loop in the test's thread, and
    # Django then refuses ORM calls from that thread; the tests set up data with
    # the ORM between browser steps, never concurrently with the loop's own work.
    # Only while the browser runs: `check --deploy` rightly refuses the variable.
    with pytest.MonkeyPatch.context() as patch, sync_playwright() as playwright:
        patch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield browser
        browser.close()


@pytest.fixture
def page(browser):
    """A fresh browser tab; any script error or refused resource (a CSP violation) fails the test."""
    context = browser.new_context(viewport={"width": 1280, "height": 800})
    page = context.new_page()
    page.set_default_timeout(15_000)
    errors = []
    page.on("pageerror", lambda error: errors.append(str(error)))
    page.on("console", lambda message: errors.append(message.text) if message.type == "error" else None)
    yield page
    context.close()
    # A page that cannot load a resource because the test stopped its server says so too.
    unexpected = [e for e in errors if "ERR_CONNECTION_REFUSED" not in e]
    assert not unexpected, unexpected


def log_in(page, base_url: str, username: str, password: str, path: str = "/") -> None:
    """Log in through the real login form, arriving at `path`."""
    page.goto(base_url + path)
    assert "/admin/login/" in page.url
    page.fill("#id_username", username)
    page.fill("#id_password", password)
    page.click("input[type=submit]")
    page.wait_for_url(base_url + path)
