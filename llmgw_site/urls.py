from django.contrib import admin
from django.urls import include, path

urlpatterns = [
    path("admin/", admin.site.urls),
    # The operators' API (docs/api.md); the agent API is at /api/v1/ in nodes.urls.
    path("api/ops/v1/", include("opsapi.urls")),
    path("", include("opsapi.page_urls")),
    path("", include("nodes.urls")),
]
