"""What a request's environ must show before anything is served: a Host we answer to, and HTTPS for a credential.

Both are checked where a request first arrives: in `EntryMiddleware`, the first
of Django's chain, and at the heartbeat's fast path (nodes/api/fastpath.py),
which answers before Django's chain and so before its `Host` check.

- **Host.** An agent API request for a host not in ALLOWED_HOSTS is refused
  with 400 in JSON, not Django's HTML page for DisallowedHost.
- **A credential over plain HTTP.** With `LLMGW_REQUIRE_HTTPS` (on unless
  DEBUG), a request that carries `Authorization` (an operator's token, a node's
  or the join token, the metrics token) and did not arrive over HTTPS is
  refused with 403 and nothing is served. Redirecting it would be too late: the
  secret has crossed the network in the clear already. A client on loopback
  may still use plain HTTP where `LLMGW_PLAIN_HTTP_FROM_LOOPBACK` says so.

A refusal's body serves both of its readers: `field` and `reason` are the agent
protocol's `Rejection`, and `error` with `field` the operators' API's shape.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Callable
from functools import cache

from django.conf import settings
from django.core.signals import setting_changed
from django.dispatch import receiver
from django.http import HttpRequest, HttpResponse
from django.http.request import split_domain_port

from agent import protocol
from nodes.api.rejections import Answer
from nodes.ratelimit import address_of

API_PATHS = "/api/"
HTTPS_REQUIRED = "HTTPS is required: this request carries a credential and came over plain HTTP; nothing was served"


def refusal(status: int, field: str, reason: str) -> Answer:
    body = protocol.encoder.encode({"field": field, "reason": reason, "error": reason})
    return Answer(status, body)


@cache
def host_rule() -> tuple[frozenset[str], tuple[str, ...], bool]:
    """ALLOWED_HOSTS compiled once per process, as Django reads it: exact names, `.suffix` patterns, `*`."""
    allowed = list(settings.ALLOWED_HOSTS)
    if settings.DEBUG and not allowed:
        allowed = [".localhost", "127.0.0.1", "[::1]"]
    exact = frozenset(host.lower() for host in allowed if not host.startswith("."))
    suffixes = tuple(host.lower() for host in allowed if host.startswith("."))
    return exact, suffixes, "*" in exact


@receiver(setting_changed)
def _forget_host_rule(setting: str, **kwargs) -> None:
    # Settings change only in tests; production reads them once.
    if setting in ("ALLOWED_HOSTS", "DEBUG"):
        host_rule.cache_clear()


def host_allowed(environ: dict) -> bool:
    exact, suffixes, anything = host_rule()
    if anything:
        return True
    host = (environ.get("HTTP_HOST") or environ.get("SERVER_NAME", "")).lower()
    # The usual case, a listed name with or without a port, costs a set lookup: every heartbeat asks.
    name, colon, port = host.rpartition(":")
    if host in exact or (colon and port.isdigit() and name in exact):
        return True
    domain = name if colon and port.isdigit() else host
    if not any(domain == suffix[1:] or domain.endswith(suffix) for suffix in suffixes):
        return False
    # A `.suffix` match must also be a well-formed name, as Django's own parsing requires.
    return split_domain_port(host)[0] == domain


def from_loopback(environ: dict) -> bool:
    try:
        return ipaddress.ip_address(address_of(environ)).is_loopback
    except ValueError:
        return False


def credential_in_the_clear(environ: dict, secure: bool) -> bool:
    if secure or not settings.LLMGW_REQUIRE_HTTPS or "HTTP_AUTHORIZATION" not in environ:
        return False
    return not (settings.LLMGW_PLAIN_HTTP_FROM_LOOPBACK and from_loopback(environ))


def entry_refusal(environ: dict, secure: bool) -> Answer | None:
    """Why this API request is refused before anything else looks at it, if it is."""
    if not host_allowed(environ):
        return refusal(400, "Host", "this host name is not one the control plane answers to (ALLOWED_HOSTS)")
    if credential_in_the_clear(environ, secure):
        return refusal(403, "Authorization", HTTPS_REQUIRED)
    return None


class EntryMiddleware:
    """The same checks for everything Django serves: Host for the APIs, HTTPS for any credential."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]):
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        environ = request.META
        if request.path_info.startswith(API_PATHS):
            answer = entry_refusal(environ, request.is_secure())
        elif credential_in_the_clear(environ, request.is_secure()):
            answer = refusal(403, "Authorization", HTTPS_REQUIRED)
        else:
            answer = None
        return answer.as_django() if answer is not None else self.get_response(request)
