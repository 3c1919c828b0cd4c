"""Refusing a request: one exception, one JSON shape, and reading a body within bounds.

Every refusal of the agent API is a 4xx, or a 503 while the database is down,
whose body is a `protocol.Rejection` naming the field (a JSON path like
`$.load.cpu_percent`, a header, or "database") and why.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import Any

import msgspec
from django.http import HttpResponse

from agent import protocol

# The protocol's own messages nest five levels deep at most ($.inventory.fabrics[0].hcas);
# deeper data can only be an unknown field, and is refused rather than walked.
MAX_DEPTH = 16
# A string (possibly with escapes), or one bracket.
_JSON_TOKENS = re.compile(rb'"[^"\\]*+(?:\\.[^"\\]*+)*+"|[\[\]{}]')
_OPENERS = frozenset(b"[{")


class Rejected(Exception):
    """A request refused; `outcome` is the short reason counted in the self-metrics."""

    def __init__(self, status: int, field: str, reason: str, outcome: str, retry_after: int | None = None):
        super().__init__(f"{field}: {reason}")
        self.status = status
        self.field = field
        self.reason = reason
        self.outcome = outcome
        self.retry_after = retry_after

    def answer(self) -> Answer:
        headers = []
        if self.status == 401:
            headers.append(("WWW-Authenticate", "Bearer"))
        if self.retry_after is not None:
            headers.append(("Retry-After", str(self.retry_after)))
        return json_answer(protocol.Rejection(field=self.field, reason=self.reason), self.status, headers)

    def response(self) -> HttpResponse:
        return self.answer().as_django()


@dataclass
class Answer:
    """An agent API answer as bytes and headers, before any framework's response object is made of it.

    The heartbeat is served straight from WSGI (nodes/api/fastpath.py), where
    building a Django `HttpResponse` would cost more than the answer itself;
    registration and the Django view of the heartbeat turn it into one.
    """

    status: int
    body: bytes
    headers: list[tuple[str, str]] = field(default_factory=list)

    @property
    def status_line(self) -> str:
        return f"{self.status} {HTTPStatus(self.status).phrase}"

    def wsgi_headers(self) -> list[tuple[str, str]]:
        return [("Content-Type", "application/json"), ("Content-Length", str(len(self.body))), *self.headers]

    def as_django(self) -> HttpResponse:
        response = HttpResponse(self.body, status=self.status, content_type="application/json")
        for name, value in self.headers:
            response[name] = value
        if self.status >= 500:
            # Django would log each such response at ERROR as it leaves; whoever
            # refuses with a 5xx logs it at its own pace (an outage: every 30 s).
            response._has_been_logged = True
        return response


def json_answer(message: protocol.Struct, status: int = 200, headers: list[tuple[str, str]] | None = None) -> Answer:
    return Answer(status, protocol.encode(message), headers or [])


def json_response(message: protocol.Struct, status: int = 200) -> HttpResponse:
    return json_answer(message, status).as_django()


def bearer_token(meta: Mapping[str, Any]) -> str:
    """The bearer token of a request's WSGI environ (Django's `request.META`)."""
    scheme, _, token = meta.get("HTTP_AUTHORIZATION", "").partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token:
        raise Rejected(401, "Authorization", "a bearer token is required", "unauthorized")
    return token


def read_json_body(meta: Mapping[str, Any], read: Callable[[int], bytes]) -> bytes:
    """The body, refused before it is read if it is not JSON or is too large.

    `meta` is the request's WSGI environ (Django's `request.META`); `read(n)` reads
    at most n bytes of the body and no further than its Content-Length (Django's
    `request.read`, or `bounded_reader` on the WSGI input).
    """
    if meta.get("REQUEST_METHOD") != "POST":
        raise Rejected(405, "method", "only POST is allowed", "bad_method")
    content_type = meta.get("CONTENT_TYPE", "").partition(";")[0].strip()
    if content_type.lower() != "application/json":
        raise Rejected(415, "Content-Type", "must be application/json", "not_json")
    try:
        declared = int(meta.get("CONTENT_LENGTH") or 0)
    except ValueError:
        raise Rejected(400, "Content-Length", "not a number", "invalid") from None
    limit = protocol.MAX_BODY_BYTES
    if declared > limit:
        raise Rejected(413, "$", f"the body is larger than {limit} bytes", "too_large")
    if "chunked" in meta.get("HTTP_TRANSFER_ENCODING", "").lower():
        body = _read_chunked(meta, limit)
    else:
        # Read one byte past the limit: a body without a truthful length is caught too.
        body = read(limit + 1)
    if len(body) > limit:
        raise Rejected(413, "$", f"the body is larger than {limit} bytes", "too_large")
    return body


def bounded_reader(meta: Mapping[str, Any]) -> Callable[[int], bytes]:
    """`read(n)` on the raw WSGI input, never past Content-Length: a server may block reading beyond it."""
    stream = meta["wsgi.input"]
    try:
        remaining = max(int(meta.get("CONTENT_LENGTH") or 0), 0)
    except ValueError:
        remaining = 0

    def read(size: int) -> bytes:
        nonlocal remaining
        chunk = stream.read(min(size, remaining)) if remaining else b""
        remaining -= len(chunk)
        return chunk

    return read


def _read_chunked(meta: Mapping[str, Any], limit: int) -> bytes:
    """A body sent without a length (Transfer-Encoding: chunked).

    Django reads only as many bytes as Content-Length says, so none here; the body
    can be read from the WSGI input itself when the server has de-chunked it and
    marks where it ends (`wsgi.input_terminated`, as granian does). Otherwise
    reading it could block or read framing as data, so the agent is told to send
    a length instead.
    """
    if not meta.get("wsgi.input_terminated"):
        raise Rejected(411, "Content-Length", "required: this server cannot read a chunked body", "length_required")
    return meta["wsgi.input"].read(limit + 1)


def decode(body: bytes, kind: type[protocol.Struct]):
    """Decode and validate a message, or refuse it naming the first field at fault."""
    if nested_deeper_than(body, MAX_DEPTH):
        raise Rejected(400, "$", f"nested deeper than {MAX_DEPTH} levels", "invalid")
    # PostgreSQL cannot store a NUL character in text or JSON, so none may come in.
    if b"\\u0000" in body:
        raise Rejected(400, "$", "strings may not contain NUL (\\u0000)", "invalid")
    try:
        return protocol.decode(body, kind)
    except msgspec.ValidationError as exc:
        raise Rejected(400, *_field_and_reason(str(exc)), "invalid") from None
    except msgspec.DecodeError as exc:
        raise Rejected(400, "$", str(exc), "not_json") from None


def nested_deeper_than(body: bytes, limit: int) -> bool:
    """Whether the JSON nests arrays and objects more than `limit` deep (brackets in strings don't count)."""
    # Cheap bound first: an ordinary heartbeat has too few brackets to be deep.
    if body.count(b"{") + body.count(b"[") <= limit:
        return False
    depth = 0
    for match in _JSON_TOKENS.finditer(body):
        char = body[match.start()]
        if char in _OPENERS:
            depth += 1
            if depth > limit:
                return True
        elif char != 0x22:  # a closing bracket, not a string
            depth -= 1
    return False


def _field_and_reason(message: str) -> tuple[str, str]:
    """Split msgspec's "Expected `int`, got `str` - at `$.load.cpus`" (or "- at `key` in `$.labels`")."""
    reason, _, where = message.partition(" - at ")
    paths = re.findall(r"`([^`]*)`", where)
    field = next((path for path in paths if path.startswith("$")), "$")
    if where.startswith("`key`"):
        reason += " (in a key)"
    return field, reason
