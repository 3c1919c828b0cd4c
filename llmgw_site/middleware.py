"""The site's own middleware: the access log's line for each request Django answers (lib/access_log.py)."""

from __future__ import annotations

import time
from collections.abc import Callable

from django.http import HttpRequest, HttpResponse

from lib import access_log
from nodes.ratelimit import client_address


class AccessLogMiddleware:
    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]):
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        started = time.perf_counter()
        response = self.get_response(request)
        seconds = time.perf_counter() - started
        access_log.record(client_address(request), request.method, request.path, response.status_code, seconds)
        return response
