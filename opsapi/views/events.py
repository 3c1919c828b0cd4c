"""Node events since a cursor, so a script follows changes without reading everything again."""

from __future__ import annotations

from drf_spectacular.utils import extend_schema
from rest_framework.request import Request
from rest_framework.response import Response

from inventory.models import NodeEvent
from opsapi.nodedetail import event_fields
from opsapi.serializers.events import EventPageSerializer, EventParams
from opsapi.views.base import REFUSALS, OpsView, params


def events_after(since: int | None, node: str | None, limit: int) -> dict:
    """Events with an id above `since`, oldest first; without `since`, the latest `limit` of them.

    The id is the cursor: it only grows, so nothing is read twice and, once
    committed, nothing is skipped.
    """
    events = NodeEvent.objects.all()
    if node:
        events = events.filter(node_id=node)
    if since is None:
        found = list(events.order_by("-id")[:limit])[::-1]
        more = False
    else:
        found = list(events.filter(id__gt=since).order_by("id")[: limit + 1])
        more = len(found) > limit
        found = found[:limit]
    if found:
        cursor = found[-1].pk
    elif since is not None:
        cursor = since
    else:
        cursor = 0
    return {"cursor": cursor, "more": more, "events": [event_fields(e) for e in found]}


class Events(OpsView):
    @extend_schema(
        operation_id="events_list",
        parameters=[EventParams],
        responses={200: EventPageSerializer, **REFUSALS},
        summary="Node events (state changes, registrations, admin actions) after a cursor",
    )
    def get(self, request: Request) -> Response:
        asked = params(EventParams, request)
        data = events_after(asked.get("since"), asked.get("node"), asked["limit"])
        return Response(EventPageSerializer(data).data)
