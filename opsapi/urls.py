"""/api/ops/v1/: the operators' API (docs/api.md). The agent API at /api/v1/ is apart and unchanged."""

from django.urls import path, re_path
from drf_spectacular.views import SpectacularAPIView

from opsapi.views import actions, deployments, events, gateway, me, nodes, usage
from opsapi.views.base import unknown_path

urlpatterns = [
    path("schema/", SpectacularAPIView.as_view(), name="opsapi-schema"),
    path("me/", me.Me.as_view(), name="opsapi-me"),
    path("nodes/", nodes.NodeList.as_view(), name="opsapi-nodes"),
    path("nodes/<str:node_id>/", nodes.NodeDetail.as_view(), name="opsapi-node"),
    path("nodes/<str:node_id>/drain/", nodes.NodeDrain.as_view(), name="opsapi-node-drain"),
    path("node-actions/", actions.NodeActions.as_view(), name="opsapi-node-actions"),
    path("deployments/", deployments.DeploymentList.as_view(), name="opsapi-deployments"),
    path("deployments/<str:name>/", deployments.DeploymentDetail.as_view(), name="opsapi-deployment"),
    path("events/", events.Events.as_view(), name="opsapi-events"),
    path("tenants/", gateway.TenantList.as_view(), name="opsapi-tenants"),
    path("tenants/<str:name>/", gateway.TenantDetail.as_view(), name="opsapi-tenant"),
    path("usage/", usage.UsageList.as_view(), name="opsapi-usage"),
    path("keys/", gateway.KeyList.as_view(), name="opsapi-keys"),
    path("keys/<int:key_id>/", gateway.KeyDetail.as_view(), name="opsapi-key"),
    # Anything else under the prefix is a JSON 404 too, not the site's HTML page.
    re_path(r"^", unknown_path),
]
