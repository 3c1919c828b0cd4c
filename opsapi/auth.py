"""Who is calling: a personal token in `Authorization: Bearer …`, and what its scope allows.

Refused tokens count against the caller's address on the same Redis counters
as the agent API's, and an address over the limit is refused before its token
is even looked at, so guessing tokens is as pointless here as there.
"""

from __future__ import annotations

import redis
from django.conf import settings
from rest_framework import exceptions, permissions
from rest_framework.authentication import BaseAuthentication, get_authorization_header
from rest_framework.request import Request

from opsapi.models import ApiToken, Scope
from opsapi.upstream import TOO_MANY_REFUSED, Limiter, client_address, count_failure, warn_unlimited

KEYWORD = b"bearer"


class TooManyRefused(exceptions.APIException):
    status_code = 429
    default_detail = TOO_MANY_REFUSED
    default_code = "too_many_refused"

    def __init__(self, retry_after: int):
        super().__init__()
        self.wait = retry_after


class TokenAuthentication(BaseAuthentication):
    limiter: Limiter | None = None

    def authenticate(self, request: Request):
        header = get_authorization_header(request).split()
        if not header:
            return None
        address = client_address(request._request)
        limiter = self.limiter or Limiter()
        try:
            failures, remaining = limiter.count(f"fail:{address}")
        except redis.RedisError as exc:
            # As for the agent API: a Redis outage lifts the limit rather than locking everyone out.
            warn_unlimited("API token limits not applied while Redis is unavailable: %s", exc)
        else:
            if failures >= settings.LLMGW_AUTH_FAILURES_PER_MINUTE:
                raise TooManyRefused(remaining)
        token = None
        if header[0].lower() == KEYWORD and len(header) == 2:
            try:
                token = ApiToken.find(header[1].decode())
            except UnicodeDecodeError:
                token = None
        if token is None:
            count_failure(address, limiter)
            raise exceptions.AuthenticationFailed("unknown, expired or revoked token")
        token.touch()
        return token.user, token

    def authenticate_header(self, request: Request) -> str:
        return 'Bearer realm="llmgw"'


def token_of(request: Request) -> ApiToken:
    return request.auth


class ReadOrOperate(permissions.BasePermission):
    """Any token may read; changing anything needs an `operate` token of a staff user."""

    message = "this token may only read: make an operate token (staff only) to act"

    def has_permission(self, request: Request, view) -> bool:
        if not isinstance(request.auth, ApiToken):
            return False
        if request.method in permissions.SAFE_METHODS:
            return True
        return request.auth.scope == Scope.OPERATE and request.user.is_staff


def require_perm(request: Request, perm: str) -> None:
    """The user's own rights still apply behind an operate token."""
    if not request.user.has_perm(perm):
        raise exceptions.PermissionDenied(f"{request.user.get_username()} lacks the permission {perm}")
