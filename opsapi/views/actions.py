"""Acting on nodes: cordon, drain or uncordon many at once, each recorded with the token that did it."""

from __future__ import annotations

from django.db.models import Q
from drf_spectacular.utils import extend_schema
from rest_framework.request import Request
from rest_framework.response import Response

from inventory.models import Node
from inventory.operator import ACTIONS
from inventory.queries import label_filter
from opsapi.audit import change_node
from opsapi.auth import require_perm
from opsapi.errors import field_error
from opsapi.serializers.actions import MAX_NODES, NodeActionInput, NodeActionOutput
from opsapi.views.base import REFUSALS, OpsView, body


def chosen_nodes(asked: dict) -> list[Node]:
    """The nodes named, or those the selector matches; a wrong name or an empty match is refused."""
    if "nodes" in asked:
        wanted = list(dict.fromkeys(asked["nodes"]))
        found = {node.pk: node for node in Node.objects.filter(pk__in=wanted)}
        missing = [pk for pk in wanted if pk not in found]
        if missing:
            raise field_error("nodes", f"no such node: {', '.join(missing[:10])}")
        return [found[pk] for pk in wanted]
    condition = Q()
    for key, value in asked["selector"]:
        condition &= label_filter(key, value)
    nodes = list(Node.objects.filter(condition).order_by("id")[: MAX_NODES + 1])
    if not nodes:
        raise field_error("selector", "matches no node")
    if len(nodes) > MAX_NODES:
        raise field_error("selector", f"matches more than {MAX_NODES} nodes: narrow it")
    return nodes


class NodeActions(OpsView):
    @extend_schema(
        operation_id="nodes_act",
        request=NodeActionInput,
        responses={200: NodeActionOutput, **REFUSALS},
        summary="Cordon, drain or uncordon nodes by id or by label selector, with a reason",
        description="Drain returns at once; follow it with GET /nodes/{node_id}/drain/.",
    )
    def post(self, request: Request) -> Response:
        require_perm(request, "inventory.change_node")
        asked = body(NodeActionInput, request)
        new_state = ACTIONS[asked["action"]]
        results = []
        for node in chosen_nodes(asked):
            changed = change_node(node, new_state, request.auth, asked["reason"])
            results.append({"node": node.pk, "changed": changed, "admin_state": node.admin_state, "state": node.state})
        data = {
            "action": asked["action"],
            "reason": asked["reason"].strip(),
            "changed": sum(r["changed"] for r in results),
            "results": results,
        }
        return Response(NodeActionOutput(data).data)
