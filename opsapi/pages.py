"""The Tokens page: a signed-in user makes, sees and revokes their own API tokens.

A new token's secret is in the answer to the POST that made it and nowhere
else: only its digest is kept, so it cannot be shown again.
"""

from __future__ import annotations

from django.contrib import messages
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_http_methods, require_POST

from nodes.views.access import login_required
from opsapi.forms import NewTokenForm
from opsapi.models import ApiToken


@require_http_methods(["GET", "POST"])
@login_required
def tokens(request: HttpRequest) -> HttpResponse:
    created = secret = None
    form = NewTokenForm(request.POST or None, user=request.user)
    if request.method == "POST" and form.is_valid():
        created, secret = form.make()
        form = NewTokenForm(user=request.user)
    context = {
        "form": form,
        "created": created,
        "secret": secret,
        # One's own tokens only: nobody sees another user's, not even their names.
        "tokens": ApiToken.objects.filter(user=request.user),
        "api_url": request.build_absolute_uri("/"),
    }
    response = render(request, "opsapi/tokens.html", context)
    # The secret is in this page: no cache may keep it.
    response["Cache-Control"] = "no-store"
    return response


@require_POST
@login_required
def revoke(request: HttpRequest, key: str) -> HttpResponse:
    token = ApiToken.objects.filter(user=request.user, key=key).first()
    if token is None:
        raise Http404("no such token")
    if token.revoke(request.user.get_username()):
        messages.success(request, f"Token {token.label} revoked.")
    return redirect("opsapi-tokens")
