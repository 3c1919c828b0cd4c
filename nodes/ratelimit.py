"""Rate limits on the agent API, and the client address they are counted by.

The counters live in Redis (`livestate.limits`), so a limit holds across every
web worker and every web machine.

- registration: at most LLMGW_REGISTER_PER_MINUTE per client address, since a
  join token is shared and a leaked one must not mint tokens at line rate.
  Only registrations with a valid join token count: a stranger cannot spend
  the budget of the nodes behind the same address;
- heartbeat: at most LLMGW_HEARTBEAT_PER_MINUTE per node token (keyed by the
  digest of the whole token, never the token itself), several times what a
  healthy agent sends. A wrong secret is counted under a key of its own;
- refused credentials: after LLMGW_AUTH_FAILURES_PER_MINUTE refused tokens
  from one address, further wrong tokens from it are answered 429 rather than
  401 for the rest of the minute.

A limit on failures never refuses a valid credential: every token is checked,
and only a wrong one is counted or refused for its address's failures. Behind a
proxy or a NAT every agent shares one address, so a lockout of the address
would let anyone who reaches the control plane refuse the whole fleet.
Guessing gains nothing from this: node tokens and admin-made join tokens hold
256 random bits, and `LLMGW_JOIN_TOKEN` must be as hard to guess
(docs/operations.md).

Heartbeats are checked in the round trip that admits them
(`livestate/beatscript.py`), on the same counters: at 2,000 heartbeats a
second, more round trips each would cost more than the rest of the heartbeat.
A credential refused elsewhere (not a node token at all, a node whose card is
not cached, a join token) is counted here, one round trip only for refusals.

A Redis outage lifts the rate limits rather than refusing every agent: the
heartbeat path reports that outage itself, and a fleet that cannot beat would
be marked unreachable for the control plane's failure.
"""

from __future__ import annotations

import ipaddress
import logging
import time
from collections.abc import Mapping
from typing import Any

import redis
from django.conf import settings
from django.http import HttpRequest

from lib.logs import OccasionalWarning
from livestate import keys, limits
from livestate.limits import Limiter
from nodes.api.rejections import Rejected

log = logging.getLogger(__name__)

# While Redis is down every agent request would log the same warning: said once per 30 s.
warn_unlimited = OccasionalWarning(log, 30.0)

TOO_MANY_REFUSED = "too many refused tokens from this address"


def client_address(request: HttpRequest) -> str:
    """The agent's address: REMOTE_ADDR, or the entry our own proxies added to X-Forwarded-For.

    With LLMGW_PROXY_HOPS proxies in front, each appends the address it saw, so the
    client is that many entries from the right; anything further left was written by
    the client and proves nothing.
    """
    return address_of(request.META)


def address_of(meta: Mapping[str, Any]) -> str:
    """`client_address` of a request's WSGI environ (Django's `request.META`)."""
    hops = settings.LLMGW_PROXY_HOPS
    if hops:
        forwarded = [part.strip() for part in meta.get("HTTP_X_FORWARDED_FOR", "").split(",") if part.strip()]
        if len(forwarded) >= hops:
            return forwarded[-hops]
    return meta.get("REMOTE_ADDR", "")


def as_ip(address: str) -> str | None:
    """The client address if it is an IP address, in its canonical form; else None.

    A proxy may forward something else ("unknown", a name); nothing but an
    address the control plane saw is recorded as where a node is.
    """
    try:
        return str(ipaddress.ip_address(address))
    except ValueError:
        return None


def locked(now: float) -> Rejected:
    """The answer to a wrong credential from an address that has spent its failure budget this minute."""
    return Rejected(429, "authorization", TOO_MANY_REFUSED, "rate_limited", limits.seconds_left(now))


def refused_credential(address: str, reason: str, now: float | None = None, limiter: Limiter | None = None) -> Rejected:
    """Count a wrong credential against its address: 401 with `reason`, or 429 once the budget is spent."""
    now = now if now is not None else time.time()
    try:
        failures, _ = (limiter or Limiter()).hit(keys.refused_tokens(address), now)
    except redis.RedisError as exc:
        warn_unlimited("agent API limits not applied while Redis is unavailable: %s", exc)
        failures = 0
    if failures > settings.LLMGW_AUTH_FAILURES_PER_MINUTE:
        return locked(now)
    return Rejected(401, "Authorization", reason, "unauthorized")


def check_registration(address: str, now: float | None = None, limiter: Limiter | None = None) -> None:
    """Count a registration with a valid join token against its address; raises a 429 past the limit."""
    try:
        hits, remaining = (limiter or Limiter()).hit(keys.registrations(address), now)
    except redis.RedisError as exc:
        warn_unlimited("agent API limits not applied while Redis is unavailable: %s", exc)
        return
    limit = settings.LLMGW_REGISTER_PER_MINUTE
    if hits > limit:
        reason = f"more than {limit} registrations from this address per minute"
        raise Rejected(429, "rate", reason, "rate_limited", remaining)
