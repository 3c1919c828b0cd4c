"""The Tokens page and the admin: tokens made, shown once, listed to their owner only, revoked."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.contrib.auth import get_user_model
from django.utils import timezone

from opsapi.models import ApiToken
from tests.opsapi_support import make_token

pytestmark = pytest.mark.django_db


def test_anonymous_is_sent_to_login(client):
    response = client.get("/tokens/")
    assert response.status_code == 302 and response["Location"].startswith("/admin/login/")


def test_the_header_links_to_the_tokens_page(client, viewer, cluster):
    client.force_login(viewer)
    assert 'href="/tokens/"' in client.get("/").content.decode()


def test_a_token_is_shown_once_and_then_only_its_key(client, viewer):
    client.force_login(viewer)
    made = client.post("/tokens/", {"name": "laptop", "scope": "read", "lifetime_days": "30"})
    assert made.status_code == 200
    assert made["Cache-Control"] == "no-store"
    secret = re.search(r'id="token-secret">([^<]+)<', made.content.decode()).group(1)
    token = ApiToken.objects.get(user=viewer)
    assert ApiToken.find(secret) == token
    later = client.get("/tokens/").content.decode()
    assert token.key in later
    assert secret not in later and secret.split(".")[1] not in later


def test_a_viewer_is_not_offered_operate_and_cannot_force_it(client, viewer):
    client.force_login(viewer)
    assert 'value="operate"' not in client.get("/tokens/").content.decode()
    client.post("/tokens/", {"name": "sneaky", "scope": "operate", "lifetime_days": "30"})
    assert not ApiToken.objects.filter(user=viewer, scope="operate").exists()


def test_staff_may_make_an_operate_token(client, operator):
    client.force_login(operator)
    client.post("/tokens/", {"name": "maintenance", "scope": "operate", "lifetime_days": "7"})
    assert ApiToken.objects.get(user=operator).scope == "operate"


def test_one_users_tokens_are_invisible_and_unrevocable_to_another(client, viewer, operator):
    token, _ = make_token(operator, name="operators-secret-laptop")
    client.force_login(viewer)
    page = client.get("/tokens/").content.decode()
    assert "operators-secret-laptop" not in page and token.key not in page
    assert client.post(f"/tokens/{token.key}/revoke/").status_code == 404
    token.refresh_from_db()
    assert not token.revoked


def test_the_owner_revokes_a_token(client, viewer):
    token, _ = make_token(viewer)
    client.force_login(viewer)
    client.post(f"/tokens/{token.key}/revoke/")
    token.refresh_from_db()
    assert token.revoked and token.revoked_by == "viewer"


def test_staff_make_a_token_for_themselves_in_the_admin_and_see_it_once(client, operator):
    # For another user, only a superuser may, and then nobody sees it (tests/test_security_tokens.py).
    client.force_login(operator)
    expires = timezone.now() + timedelta(days=30)
    response = client.post(
        "/admin/opsapi/apitoken/add/",
        {"user": operator.pk, "name": "ci", "scope": "read", **admin_datetime(expires)},
        follow=True,
    )
    token = ApiToken.objects.get(user=operator)
    secret = re.search(r"(llmgw-ops-[0-9a-f]{16}\.[A-Za-z0-9_-]+)", response.content.decode()).group(1)
    assert ApiToken.find(secret) == token
    assert secret not in client.get(f"/admin/opsapi/apitoken/{token.pk}/change/").content.decode()


def test_the_admin_refuses_a_token_living_over_a_year(client, operator, viewer):
    client.force_login(operator)
    expires = timezone.now() + timedelta(days=400)
    response = client.post(
        "/admin/opsapi/apitoken/add/", {"user": viewer.pk, "name": "ci", "scope": "read", **admin_datetime(expires)}
    )
    assert "at most 365 days" in response.content.decode()
    assert not ApiToken.objects.filter(user=viewer).exists()


def admin_datetime(when) -> dict:
    return {"expires_at_0": when.strftime("%Y-%m-%d"), "expires_at_1": when.strftime("%H:%M:%S")}


def test_the_admin_refuses_an_operate_token_for_a_non_staff_user(client, operator, viewer):
    client.force_login(operator)
    client.post(
        "/admin/opsapi/apitoken/add/",
        {"user": viewer.pk, "name": "ci", "scope": "operate", **admin_datetime(timezone.now() + timedelta(days=9))},
    )
    assert not ApiToken.objects.filter(user=viewer).exists()


def test_staff_revoke_any_token_in_the_admin(client, operator, viewer):
    token, _ = make_token(viewer)
    client.force_login(operator)
    client.post(
        "/admin/opsapi/apitoken/",
        {"action": "revoke", "_selected_action": [token.pk]},
    )
    token.refresh_from_db()
    assert token.revoked and token.revoked_by == get_user_model().objects.get(pk=operator.pk).username
