"""Who is calling: a personal token in `Authorization: Bearer …`, and what its scope allows.

Refused tokens count against the caller's address on the same Redis counters
as the agent API's, by the same rule (nodes/ratelimit.py): past the budget a
wrong token is answered 429, while a right one is always accepted, since
operators behind one proxy or NAT share an address with whoever guesses.
"""

from __future__ import annotations

from rest_framework import exceptions, permissions
from rest_framework.authentication import BaseAuthentication, get_authorization_header
from rest_framework.request import Request

from livestate.limits import Limiter
from nodes.ratelimit import TOO_MANY_REFUSED, client_address, refused_credential
from opsapi.models import ApiToken, Scope

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
        token = None
        if header[0].lower() == KEYWORD and len(header) == 2:
            try:
                token = ApiToken.find(header[1].decode())
            except UnicodeDecodeError:
                token = None
        if token is None:
            address = client_address(request._request)
            refusal = refused_credential(address, "unknown, expired or revoked token", limiter=self.limiter)
            if refusal.status == 429:
                raise TooManyRefused(refusal.retry_after or 60)
            raise exceptions.AuthenticationFailed(refusal.reason)
        token.touch()
        return token.user, token

    def authenticate_header(self, request: Request) -> str:
        return 'Bearer realm="llmgw"'


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
