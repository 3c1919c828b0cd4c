"""The browser the tests and `make screenshots` drive: Debian's chromium, headless, never one playwright downloads.

`playwright install` fetches a browser, which fails offline; the system one comes
from `scripts/system-packages --with-browser`.
"""

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
