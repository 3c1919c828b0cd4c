from django.urls import path

from nodes import health, targets

urlpatterns = [
    path("healthz", health.healthz, name="healthz"),
    path("readyz", health.readyz, name="readyz"),
    path("api/v1/prometheus/targets", targets.prometheus_targets, name="prometheus-targets"),
]
