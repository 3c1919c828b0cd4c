"""The operator pages: the cluster, a node, a served model, the tenants and one tenant; and the actions staff take."""

from nodes.views.actions import set_node_admin_state
from nodes.views.cluster import cluster
from nodes.views.models import model, model_charts
from nodes.views.node import node, node_charts
from nodes.views.tenants import tenant, tenant_charts, tenants

__all__ = [
    "cluster",
    "model",
    "model_charts",
    "node",
    "node_charts",
    "set_node_admin_state",
    "tenant",
    "tenant_charts",
    "tenants",
]
