"""Every refusal as JSON naming what was wrong: `{"error": …, "field": …}`.

A caller's mistake is a 4xx whose `field` names the parameter or body field
at fault (null when it is not one field); a database outage is a 503, never a 500.
"""

from __future__ import annotations

import logging

from django.db import DatabaseError
from django.http import Http404
from rest_framework import exceptions, serializers, status
from rest_framework.response import Response
from rest_framework.views import exception_handler

log = logging.getLogger(__name__)


class ErrorSerializer(serializers.Serializer):
    error = serializers.CharField(help_text="What was wrong, naming the field when there is one.")
    field = serializers.CharField(allow_null=True, help_text="The parameter or body field at fault.")
    errors = serializers.DictField(
        child=serializers.ListField(child=serializers.CharField()),
        required=False,
        help_text="Every field at fault and what is wrong with it (validation errors only).",
    )


def _flatten(detail, prefix: str = "") -> dict[str, list[str]]:
    """Nested validation errors as `a.b` → messages, so a field deep in a body is still named."""
    if isinstance(detail, dict):
        flat: dict[str, list[str]] = {}
        for key, value in detail.items():
            name = str(key) if key != "non_field_errors" else ""
            flat.update(_flatten(value, f"{prefix}.{name}" if prefix and name else prefix or name))
        return flat
    if isinstance(detail, list) and detail and all(isinstance(item, str) for item in detail):
        return {prefix: [str(item) for item in detail]}
    if isinstance(detail, list):
        flat = {}
        for index, item in enumerate(detail):
            flat.update(_flatten(item, f"{prefix}.{index}" if prefix else str(index)))
        return flat
    return {prefix: [str(detail)]}


def field_error(field: str, message: str) -> exceptions.ValidationError:
    return exceptions.ValidationError({field: [message]})


def handle(exc: Exception, context: dict) -> Response | None:
    if isinstance(exc, DatabaseError):
        log.warning("ops API answered 503: %s", exc)
        return Response({"error": "the database is unavailable; try again", "field": None}, status=503)
    if isinstance(exc, Http404):
        exc = exceptions.NotFound(str(exc) or "not found")
    response = exception_handler(exc, context)
    if response is None:
        return None
    if isinstance(exc, exceptions.ValidationError):
        flat = _flatten(exc.detail)
        field, messages = next(iter(flat.items()), ("", ["invalid"]))
        text = f"{field}: {messages[0]}" if field else messages[0]
        response.data = {"error": text, "field": field or None, "errors": flat}
        response.status_code = status.HTTP_400_BAD_REQUEST
    else:
        detail = exc.detail if isinstance(exc, exceptions.APIException) else str(exc)
        response.data = {"error": str(detail), "field": "authorization" if response.status_code in (401, 429) else None}
    return response
