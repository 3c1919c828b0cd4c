"""What every API view shares: token authentication, the scope check, JSON only."""

from __future__ import annotations

from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.decorators import api_view, authentication_classes, permission_classes
from rest_framework.exceptions import NotFound
from rest_framework.request import Request
from rest_framework.views import APIView

from opsapi.auth import ReadOrOperate, TokenAuthentication
from opsapi.errors import ErrorSerializer

# The refusals every authenticated endpoint may answer, for the OpenAPI document.
REFUSALS = {400: ErrorSerializer, 401: ErrorSerializer, 403: ErrorSerializer, 429: ErrorSerializer}


class OpsView(APIView):
    authentication_classes = [TokenAuthentication]
    permission_classes = [ReadOrOperate]


def params(serializer_class: type[serializers.Serializer], request: Request) -> dict:
    """The query string, validated: a bad parameter is a 400 naming it."""
    serializer = serializer_class(data=request.query_params)
    serializer.is_valid(raise_exception=True)
    return serializer.validated_data


def body(serializer_class: type[serializers.Serializer], request: Request) -> dict:
    serializer = serializer_class(data=request.data)
    serializer.is_valid(raise_exception=True)
    return serializer.validated_data


@extend_schema(exclude=True)
@api_view(["GET", "POST", "PUT", "PATCH", "DELETE"])
@authentication_classes([])
@permission_classes([])
def unknown_path(request: Request):
    raise NotFound(f"no such endpoint: {request.path} (see /api/ops/v1/schema/)")
