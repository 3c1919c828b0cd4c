from django.urls import path

from nodes import health, views

urlpatterns = [
    path("healthz", health.healthz, name="healthz"),
    path("readyz", health.readyz, name="readyz"),
    # The operator pages.
    path("", views.cluster, name="cluster"),
    path("nodes/<str:node_id>/", views.node, name="node"),
    path("nodes/<str:node_id>/charts/", views.node_charts, name="node-charts"),
    path("nodes/<str:node_id>/admin-state/", views.set_node_admin_state, name="node-admin-state"),
]
