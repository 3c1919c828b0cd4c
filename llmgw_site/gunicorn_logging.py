"""Gunicorn's access log without the agent API's successful calls.

Ten thousand nodes beating every 5 s would write 2,000 access lines a second
(some 17 GB a day) and bury every page view an operator might look for. An
accepted heartbeat or registration is recorded elsewhere already (the node's
last heartbeat and events, the self-metrics counters), so only the agent API's
refusals are logged here, beside everything else. Used with
`gunicorn --logger-class llmgw_site.gunicorn_logging.AccessLog`.
"""

from __future__ import annotations

from gunicorn.glogging import Logger

AGENT_API = "/api/v1/"


def worth_logging(method: str, path: str, status: int) -> bool:
    """Every request but an agent's POST that succeeded."""
    return not (method == "POST" and path.startswith(AGENT_API) and 200 <= status < 300)


class AccessLog(Logger):
    def access(self, resp, req, environ, request_time):
        if worth_logging(environ.get("REQUEST_METHOD", ""), environ.get("PATH_INFO", ""), resp.status_code or 0):
            super().access(resp, req, environ, request_time)
