from django.urls import path

from nodes import health
from nodes.metrics import views as metrics

urlpatterns = [
    path("healthz", health.healthz, name="healthz"),
    path("readyz", health.readyz, name="readyz"),
    # Fleet metrics (nodes/metrics/).
    path("metrics", metrics.metrics, name="metrics"),
]
