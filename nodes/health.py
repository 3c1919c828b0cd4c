"""Health endpoints: /healthz says the process is up, /readyz that it can serve."""

import time

from django.db import connection
from django.http import JsonResponse
from django.views.decorators.http import require_safe

# require_safe: load balancers probe with HEAD as well as GET. The WSGI server
# (granian, runserver) sends a HEAD answer's status and headers without its body.
import livestate
from nodes.api import proxyclock


@require_safe
def healthz(request):
    # The proxy's health checks are how each web worker learns the proxy's clock (nodes/api/proxyclock.py).
    proxyclock.health_checked(request.META, time.time())
    return JsonResponse({"status": "ok"})


def _check_database() -> str | None:
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
    except Exception as exc:
        return f"database unreachable: {exc.__class__.__name__}"
    return None


def _check_redis() -> str | None:
    try:
        livestate.client().ping()
    except Exception as exc:
        return f"redis unreachable: {exc.__class__.__name__}"
    return None


@require_safe
def readyz(request):
    problems = {
        name: problem
        for name, check in (("database", _check_database), ("redis", _check_redis))
        if (problem := check())
    }
    status = 503 if problems else 200
    return JsonResponse({"status": "ready" if not problems else "not ready", "problems": problems}, status=status)
