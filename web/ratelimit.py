"""Rate limits on the agent API.

The counters live in Redis (`livestate.limits`), so a limit holds across every
gunicorn worker and every web machine.

- registration: at most LLMGW_REGISTER_PER_MINUTE per client address, since a
  join token is shared and a leaked one must not mint tokens at line rate;
- heartbeat: at most LLMGW_HEARTBEAT_PER_MINUTE per node token (keyed by its
  digest, never the token itself), several times what a healthy agent sends;
- refused credentials: after LLMGW_AUTH_FAILURES_PER_MINUTE answers of 401 to
  one address, that address is refused outright for the rest of the minute,
  which makes guessing tokens pointless.

The middleware below applies them to registration before the view reads a
byte of the body. Heartbeats are checked in the round trip that admits them
(`livestate/beatscript.py`), on the same counters: at 2,000 heartbeats a
second, two more round trips each would cost more than the rest of the
heartbeat. The views refuse bodies over `protocol.MAX_BODY_BYTES` themselves
(`web/api/rejections.py`).

A Redis outage lifts the rate limits rather than refusing every agent: the
heartbeat path reports that outage itself, and a fleet that cannot beat would
be marked unreachable for the control plane's failure.
"""

from __future__ import annotations

import contextlib
import logging

import redis
from django.conf import settings
from django.http import HttpRequest, HttpResponse

from agent import protocol
from livestate import keys
from livestate.limits import Limiter
from llmgw_site.logs import OccasionalWarning

log = logging.getLogger(__name__)

# While Redis is down every agent request would log the same warning: said once per 30 s.
warn_unlimited = OccasionalWarning(log, 30.0)

REGISTER = "/api/v1/register"
TOO_MANY_REFUSED = "too many refused tokens from this address"


def client_address(request: HttpRequest) -> str:
    """The agent's address: REMOTE_ADDR, or the entry our own proxies added to X-Forwarded-For.

    With LLMGW_PROXY_HOPS proxies in front, each appends the address it saw, so the
    client is that many entries from the right; anything further left was written by
    the client and proves nothing.
    """
    hops = settings.LLMGW_PROXY_HOPS
    if hops:
        forwarded = [part.strip() for part in request.headers.get("X-Forwarded-For", "").split(",") if part.strip()]
        if len(forwarded) >= hops:
            return forwarded[-hops]
    return request.META.get("REMOTE_ADDR", "")


def refusal(status: int, field: str, reason: str, retry_after: int | None = None) -> HttpResponse:
    response = HttpResponse(
        protocol.encode(protocol.Rejection(field=field, reason=reason)),
        status=status,
        content_type="application/json",
    )
    if retry_after is not None:
        response["Retry-After"] = str(retry_after)
    return response


class AgentAPILimitMiddleware:
    """Applies the limits above to POST /api/v1/register only."""

    def __init__(self, get_response, limiter: Limiter | None = None):
        self.get_response = get_response
        self.limiter = limiter or Limiter()

    def __call__(self, request: HttpRequest) -> HttpResponse:
        if request.path != REGISTER:
            return self.get_response(request)
        refused = self.check_rate(request)
        if refused is not None:
            return refused
        response = self.get_response(request)
        if response.status_code == 401:
            self.count_failure(request)
        return response

    def check_rate(self, request: HttpRequest) -> HttpResponse | None:
        address = client_address(request)
        try:
            failures, remaining = self.limiter.count(keys.refused_tokens(address))
            if failures >= settings.LLMGW_AUTH_FAILURES_PER_MINUTE:
                return refusal(429, "authorization", TOO_MANY_REFUSED, remaining)
            hits, remaining = self.limiter.hit(keys.registrations(address))
        except redis.RedisError as exc:
            warn_unlimited("agent API limits not applied while Redis is unavailable: %s", exc)
            return None
        limit = settings.LLMGW_REGISTER_PER_MINUTE
        if hits > limit:
            return refusal(429, "rate", f"more than {limit} registrations from this address per minute", remaining)
        return None

    def count_failure(self, request: HttpRequest) -> None:
        count_failure(client_address(request), self.limiter)


def count_failure(address: str, limiter: Limiter | None = None) -> None:
    """Count a refused credential against the address it came from."""
    with contextlib.suppress(redis.RedisError):
        (limiter or Limiter()).hit(keys.refused_tokens(address))
