"""The heartbeat goes straight to its view, past the middleware that serves people.

Ten thousand nodes send 2,000 heartbeats a second, each costing a web worker
CPU; profiling one worker (docs/operations.md, "Where a heartbeat's time goes")
found a third of it in middleware and URL resolution that an agent's POST has
no use for: sessions, CSRF (the view is exempt anyway), authentication,
messages, htmx, the common middleware's redirects, whitenoise's static files.
This middleware sits right after Django's SecurityMiddleware, which still
applies its headers and its HTTPS rules, and hands `POST /api/v1/heartbeat`
to the view itself; every other request goes down the ordinary chain. Of the
headers the skipped middleware would add, the response keeps the one that
still means something for a JSON answer (`X-Frame-Options`); the
Content-Security-Policy governs pages, and an agent renders none.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import cache

from django.http import HttpRequest, HttpResponse
from django.urls import reverse

from web.api import views


@cache
def heartbeat_path() -> str:
    # Read from the URLconf on first use, so the path has one home (web/urls.py).
    return reverse("api-heartbeat")


class HeartbeatFastPath:
    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]):
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        if request.path_info != heartbeat_path():
            return self.get_response(request)
        response = views.heartbeat(request)
        response.headers["X-Frame-Options"] = "DENY"
        return response
