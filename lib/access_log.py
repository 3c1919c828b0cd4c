"""The web tier's access log, written by the application: every request but the agent API's accepted calls.

Ten thousand nodes beating every 5 s would write 2,000 access lines a second
(some 17 GB a day) and bury every page view an operator might look for. An
accepted heartbeat or registration is recorded elsewhere already (the node's
last heartbeat and events, the self-metrics counters), so only the agent API's
refusals are logged, beside everything else. The application writes the log
rather than the web server, so that an accepted heartbeat costs no line at all,
not one built and then filtered out: Django's requests through
`AccessLogMiddleware` (llmgw_site/middleware.py, first in `MIDDLEWARE`), the
heartbeat's own answers in nodes/api/fastpath.py. Lines go to the
`llmgw.access` logger, at INFO.
"""

from __future__ import annotations

import logging

log = logging.getLogger("llmgw.access")

AGENT_API = "/api/v1/"


def worth_logging(method: str, path: str, status: int) -> bool:
    """Every request but an agent's POST that succeeded."""
    return not (method == "POST" and path.startswith(AGENT_API) and 200 <= status < 300)


def record(address: str, method: str, path: str, status: int, seconds: float) -> None:
    if worth_logging(method, path, status):
        log.info('%s "%s %s" %d %.1f ms', address, method, path, status, 1000 * seconds)
