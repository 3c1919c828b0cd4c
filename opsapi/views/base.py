"""What every API view shares: token authentication, the scope check, JSON only."""

from __future__ import annotations

from rest_framework import serializers
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
