from django.conf import settings
from django.templatetags.static import static
from django.urls import path
from django.views.generic import RedirectView

from nodes import health, targets, views
from nodes.api import views as api
from nodes.metrics import views as metrics

urlpatterns = [
    path("healthz", health.healthz, name="healthz"),
    path("readyz", health.readyz, name="readyz"),
    # The agent API (docs/protocol.md).
    path("api/v1/register", api.register, name="api-register"),
    path("api/v1/heartbeat", api.heartbeat, name="api-heartbeat"),
    # Prometheus' service discovery of the engines (docs/placement.md).
    path("api/v1/prometheus/targets", targets.prometheus_targets, name="prometheus-targets"),
    # Fleet metrics (nodes/metrics/).
    path("metrics", metrics.metrics, name="metrics"),
    # The operator pages.
    path("", views.cluster, name="cluster"),
    path("nodes/<str:node_id>/", views.node, name="node"),
    path("nodes/<str:node_id>/charts/", views.node_charts, name="node-charts"),
    path("nodes/<str:node_id>/admin-state/", views.set_node_admin_state, name="node-admin-state"),
    path("models/<str:served_model>/", views.model, name="model"),
    path("models/<str:served_model>/charts/", views.model_charts, name="model-charts"),
    path("tenants/", views.tenants, name="tenants"),
    path("tenants/<str:name>/", views.tenant, name="tenant"),
    path("tenants/<str:name>/charts/", views.tenant_charts, name="tenant-charts"),
    # Browsers ask for /favicon.ico on every page, the admin's included.
    path("favicon.ico", RedirectView.as_view(url=static("llmgw/favicon.svg"), permanent=True)),
]

if settings.LLMGW_BENCH_EMPTY_VIEW:
    urlpatterns.append(path("api/v1/bench-empty", api.empty, name="api-bench-empty"))
