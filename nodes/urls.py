from django.urls import path

from nodes import health, targets
from nodes.metrics import views as metrics

urlpatterns = [
    path("healthz", health.healthz, name="healthz"),
    path("readyz", health.readyz, name="readyz"),
    path("api/v1/prometheus/targets", targets.prometheus_targets, name="prometheus-targets"),
    # Fleet metrics (nodes/metrics/).
    path("metrics", metrics.metrics, name="metrics"),
]
