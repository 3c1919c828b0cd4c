from django.conf import settings
from django.urls import path

from nodes import health
from nodes.api import views as api
from nodes.metrics import views as metrics

urlpatterns = [
    path("healthz", health.healthz, name="healthz"),
    path("readyz", health.readyz, name="readyz"),
    # The agent API (docs/protocol.md).
    path("api/v1/register", api.register, name="api-register"),
    path("api/v1/heartbeat", api.heartbeat, name="api-heartbeat"),
    # Fleet metrics (nodes/metrics/).
    path("metrics", metrics.metrics, name="metrics"),
]

if settings.LLMGW_BENCH_EMPTY_VIEW:
    urlpatterns.append(path("api/v1/bench-empty", api.empty, name="api-bench-empty"))
