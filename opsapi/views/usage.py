"""Tenants' usage: what the engines reported for their requests, as the gateways' syncs recorded it."""

from __future__ import annotations

from django.db.models import Sum
from django.utils import timezone
from drf_spectacular.utils import extend_schema
from rest_framework.request import Request
from rest_framework.response import Response

from gateway.models import Usage
from opsapi.serializers.usage import UsageParams, UsageSerializer
from opsapi.views.base import REFUSALS, OpsView, params


class UsageList(OpsView):
    @extend_schema(
        operation_id="usage_list",
        parameters=[UsageParams],
        responses={200: UsageSerializer, **REFUSALS},
        summary="Tokens per tenant, model and replica since a time (counted by the hour, UTC)",
    )
    def get(self, request: Request) -> Response:
        asked = params(UsageParams, request)
        since = (timezone.now() - asked["since"]).replace(minute=0, second=0, microsecond=0)
        rows = Usage.objects.filter(hour__gte=since)
        if asked.get("tenant"):
            rows = rows.filter(tenant=asked["tenant"])
        summed = (
            rows.values("tenant", "model", "replica")
            .annotate(
                requests=Sum("requests"), prompt_tokens=Sum("prompt_tokens"), completion_tokens=Sum("completion_tokens")
            )
            .order_by("tenant", "model", "replica")
        )
        return Response(UsageSerializer({"since": since, "rows": list(summed)}).data)
