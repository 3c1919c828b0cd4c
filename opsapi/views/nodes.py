"""Reading nodes: the list, one node, a drain's progress."""

from __future__ import annotations

import time

from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework.exceptions import NotFound
from rest_framework.request import Request
from rest_framework.response import Response

from opsapi.errors import ErrorSerializer
from opsapi.nodedetail import drain_progress, find, node_detail
from opsapi.nodelist import node_rows, page_of_nodes, table_query
from opsapi.serializers.common import paging
from opsapi.serializers.nodes import DrainSerializer, NodeDetailSerializer, NodeListParams, NodeListSerializer
from opsapi.views.base import REFUSALS, OpsView, params

NODE_ID = OpenApiParameter("node_id", str, OpenApiParameter.PATH, description="The node's id.")


class NodeList(OpsView):
    @extend_schema(
        operation_id="nodes_list",
        parameters=[NodeListParams],
        responses={200: NodeListSerializer, **REFUSALS},
        summary="Nodes, filtered, sorted and paged like the cluster page",
    )
    def get(self, request: Request) -> Response:
        asked = params(NodeListParams, request)
        query = table_query(asked)
        now = time.time()
        nodes, count = page_of_nodes(query, asked["page_size"], now)
        rows, problem = node_rows(nodes, now)
        # Answered as built, not through the serializer: it would cost more than the
        # queries for 100 rows. The serializer still defines the document, and
        # tests/test_opsapi_schema.py holds the answers to it.
        return Response({**paging(count, query.page, asked["page_size"]), "load_problem": problem, "results": rows})


def node_or_404(node_id: str):
    node = find(node_id)
    if node is None:
        raise NotFound(f"no node {node_id!r}")
    return node


class NodeDetail(OpsView):
    @extend_schema(
        operation_id="nodes_retrieve",
        parameters=[NODE_ID],
        responses={200: NodeDetailSerializer, 404: ErrorSerializer, **REFUSALS},
        summary="One node: inventory, load, engines, GPUs, allocations, drain progress, last events",
    )
    def get(self, request: Request, node_id: str) -> Response:
        node = node_or_404(node_id)
        # As built, like the list (the schema test holds it to NodeDetailSerializer).
        return Response(node_detail(node, time.time()))


class NodeDrain(OpsView):
    @extend_schema(
        operation_id="nodes_drain_progress",
        parameters=[NODE_ID],
        responses={200: DrainSerializer, 404: ErrorSerializer, **REFUSALS},
        summary="How far a drain has gone: replicas left to move",
    )
    def get(self, request: Request, node_id: str) -> Response:
        progress = drain_progress([node_id]) if "\x00" not in node_id else {}
        if node_id not in progress:
            raise NotFound(f"no node {node_id!r}")
        return Response(DrainSerializer(progress[node_id]).data)
