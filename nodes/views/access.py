"""Who may see and act on the pages, and what a poll gets once the session has ended."""

from __future__ import annotations

from functools import wraps
from urllib.parse import urlsplit

from django.conf import settings
from django.contrib.auth.views import redirect_to_login
from django.utils.cache import patch_vary_headers
from django_htmx.http import HttpResponseClientRedirect


def login_required(view):
    """Django's login_required, except that an htmx poll is sent to the login page whole.

    A plain redirect would be followed by htmx and the login form swapped into
    the table.
    """

    @wraps(view)
    def wrapper(request, *args, **kwargs):
        if request.user.is_authenticated:
            response = view(request, *args, **kwargs)
        elif request.htmx:
            # Come back to the page the poll came from, not to the partial's URL.
            current = urlsplit(request.headers.get("HX-Current-URL", "/"))
            back = (current.path or "/") + (f"?{current.query}" if current.query else "")
            response = HttpResponseClientRedirect(redirect_to_login(back, settings.LOGIN_URL).url)
        else:
            response = redirect_to_login(request.get_full_path(), settings.LOGIN_URL)
        # The same URL answers a whole page or a partial, so caches must keep them apart.
        patch_vary_headers(response, ["HX-Request"])
        return response

    return wrapper
