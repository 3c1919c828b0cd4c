"""Who is calling: `llmgw login` checks a token with this before saving it."""

from __future__ import annotations

from drf_spectacular.utils import extend_schema
from rest_framework.request import Request
from rest_framework.response import Response

from opsapi.serializers.events import MeSerializer
from opsapi.views.base import REFUSALS, OpsView


class Me(OpsView):
    @extend_schema(
        operation_id="me",
        responses={200: MeSerializer, **REFUSALS},
        summary="The user and token this request is made with",
    )
    def get(self, request: Request) -> Response:
        token = request.auth
        data = {
            "user": request.user.get_username(),
            "staff": request.user.is_staff,
            "token": {"name": token.name, "key": token.key, "scope": token.scope, "expires_at": token.expires_at},
        }
        return Response(MeSerializer(data).data)
