"""POST /api/v1/heartbeat served straight from WSGI, before Django's request handling.

Ten thousand nodes send 2,000 heartbeats a second, and each costs a web worker
CPU. What an agent's POST needs is its environ, its body and an answer; what
Django's handler builds around a view (a `WSGIRequest`, the middleware chain,
URL resolution, an `HttpResponse` with its header bookkeeping) cost more than
the heartbeat's own work, once measured in a web server rather than in a loop
(docs/operations.md, "Where a heartbeat's time goes"). So the WSGI application
(llmgw_site/wsgi.py) is this wrapper: it hands the heartbeat path to
`answer_heartbeat` itself, the same function the Django view of the heartbeat
calls, and everything else to Django.

What Django would still have done for the heartbeat is done here:

- a database connection that failed or outlived `CONN_MAX_AGE` is closed once
  the answer is ready, as Django's `request_finished` signal does. Sending the
  signals themselves cost a quarter of the heartbeat, through every receiver
  and alias; the check when a request starts finds nothing the previous
  request's end did not, and the query log is reset only with DEBUG;
- an exception is logged on `django.request` and answered 500 with a JSON body;
- the security middleware's headers are added. Where it would redirect a
  plain-HTTP request to HTTPS (not by default: `SECURE_REDIRECT_EXEMPT` names
  the agent API), the request goes to Django, which does;
- a refusal gets its access log line (lib/access_log.py);
- the `Host` check and the refusal of a credential over plain HTTP are
  nodes/entry.py's, as for every other request.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Iterable
from functools import cache
from wsgiref.types import StartResponse, WSGIApplication, WSGIEnvironment

from django.conf import settings
from django.db import close_old_connections, reset_queries
from django.urls import reverse

from lib import access_log
from nodes.api.rejections import Answer, bounded_reader
from nodes.api.views import answer_heartbeat
from nodes.entry import entry_refusal
from nodes.ratelimit import address_of

log = logging.getLogger("django.request")

INTERNAL_ERROR = Answer(500, b'{"field":"$","reason":"internal error; the control plane logged it"}')


@cache
def heartbeat_path() -> str:
    # Read from the URLconf on first use, so the path has one home (nodes/urls.py).
    path: str = reverse("api-heartbeat")
    return path


@cache
def security_headers() -> tuple[tuple[str, str], ...]:
    """The headers Django's SecurityMiddleware and XFrameOptionsMiddleware add to every answer, from settings."""
    headers = [("X-Frame-Options", "DENY")]
    if settings.SECURE_CONTENT_TYPE_NOSNIFF:
        headers.append(("X-Content-Type-Options", "nosniff"))
    if settings.SECURE_REFERRER_POLICY:
        headers.append(("Referrer-Policy", settings.SECURE_REFERRER_POLICY))
    if settings.SECURE_CROSS_ORIGIN_OPENER_POLICY:
        headers.append(("Cross-Origin-Opener-Policy", settings.SECURE_CROSS_ORIGIN_OPENER_POLICY))
    return tuple(headers)


@cache
def hsts_header() -> tuple[tuple[str, str], ...]:
    if not settings.SECURE_HSTS_SECONDS:
        return ()
    value = f"max-age={settings.SECURE_HSTS_SECONDS}"
    if settings.SECURE_HSTS_INCLUDE_SUBDOMAINS:
        value += "; includeSubDomains"
    if settings.SECURE_HSTS_PRELOAD:
        value += "; preload"
    return (("Strict-Transport-Security", value),)


@cache
def redirects_to_https() -> bool:
    """Whether Django's SecurityMiddleware would redirect a plain-HTTP heartbeat (the agent API is exempt).

    Read once per process, like the middleware's own settings: a plain-HTTP heartbeat behind a proxy
    ending TLS is every heartbeat, and the exemptions are regular expressions.
    """
    path = heartbeat_path().lstrip("/")
    exempt = any(re.search(pattern, path) for pattern in settings.SECURE_REDIRECT_EXEMPT)
    return bool(settings.SECURE_SSL_REDIRECT) and not exempt


def is_secure(environ: WSGIEnvironment) -> bool:
    """Django's `request.is_secure()`: HTTPS here, or at the proxy that says so in its header."""
    if settings.SECURE_PROXY_SSL_HEADER:
        proxy_header: tuple[str, str] = settings.SECURE_PROXY_SSL_HEADER
        header, secure_value = proxy_header
        forwarded: str | None = environ.get(header)
        if forwarded is not None:
            return forwarded.split(",", 1)[0].strip() == secure_value
    return environ.get("wsgi.url_scheme") == "https"


class HeartbeatFastPath:
    """WSGI middleware: the heartbeat to `answer_heartbeat`, every other request to `application`."""

    def __init__(self, application: WSGIApplication):
        self.application = application

    def __call__(self, environ: WSGIEnvironment, start_response: StartResponse) -> Iterable[bytes]:
        if environ.get("PATH_INFO") != heartbeat_path():
            return self.application(environ, start_response)
        secure = is_secure(environ)
        if not secure and redirects_to_https():
            return self.application(environ, start_response)
        started = time.perf_counter()
        if settings.DEBUG:
            reset_queries()
        try:
            answer = entry_refusal(environ, secure) or answer_heartbeat(environ, bounded_reader(environ))
        except Exception:
            log.exception("Internal Server Error: %s", environ.get("PATH_INFO"))
            answer = INTERNAL_ERROR
        finally:
            close_old_connections()
        headers = answer.wsgi_headers()
        headers.extend(security_headers())
        if secure:
            headers.extend(hsts_header())
        start_response(answer.status_line, headers)
        if answer.status >= 300:
            access_log.record(
                address_of(environ),
                environ.get("REQUEST_METHOD", ""),
                environ["PATH_INFO"],
                answer.status,
                time.perf_counter() - started,
            )
        return [answer.body]
