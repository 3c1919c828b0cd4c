"""The operator pages: the cluster page, the node page, a served model's page, and the actions staff take from them."""

from nodes.views.actions import set_node_admin_state
from nodes.views.cluster import cluster
from nodes.views.models import model, model_charts
from nodes.views.node import node, node_charts

__all__ = ["cluster", "model", "model_charts", "node", "node_charts", "set_node_admin_state"]
