"""Tenants and API keys in the admin: a key made there is shown once, then only its prefix; revoking is an action."""

from __future__ import annotations

import re

import pytest

from gateway import usage
from gateway.models import ApiKey, Tenant, Usage, key_digest
from gateway.usage import Counted

pytestmark = pytest.mark.django_db


def test_a_key_made_in_the_admin_is_shown_once_then_only_its_prefix(client, operator):
    client.force_login(operator)
    tenant = Tenant.objects.create(name="acme")
    response = client.post(
        "/admin/gateway/apikey/add/",
        {"tenant": tenant.pk, "name": "billing", "expires_at_0": "", "expires_at_1": ""},
        follow=True,
    )
    secret = re.search(r"(llmgw-sk-[A-Za-z0-9_-]{43})", response.content.decode()).group(1)
    key = ApiKey.objects.get()
    assert key.digest == key_digest(secret) and key.expires_at is None
    page = client.get(f"/admin/gateway/apikey/{key.pk}/change/").content.decode()
    assert secret not in page and key.prefix in page
    assert secret not in client.get(f"/admin/gateway/tenant/{tenant.pk}/change/").content.decode()


def test_the_admin_refuses_a_key_that_has_already_expired(client, operator):
    client.force_login(operator)
    tenant = Tenant.objects.create(name="acme")
    response = client.post(
        "/admin/gateway/apikey/add/",
        {"tenant": tenant.pk, "name": "old", "expires_at_0": "2001-01-01", "expires_at_1": "00:00:00"},
    )
    assert "must be in the future" in response.content.decode()
    assert not ApiKey.objects.exists()


def test_revoking_in_the_admin_records_who(client, operator):
    client.force_login(operator)
    key = ApiKey(tenant=Tenant.objects.create(name="acme"))
    key.issue()
    key.save()
    client.post("/admin/gateway/apikey/", {"action": "revoke", "_selected_action": [key.pk]})
    key.refresh_from_db()
    assert key.revoked and key.revoked_by == "operator"
    assert not ApiKey.objects.usable().exists()


def test_a_viewer_cannot_reach_the_keys(client, viewer):
    client.force_login(viewer)
    assert client.get("/admin/gateway/apikey/").status_code in (302, 403)


def test_usage_is_listed_in_the_admin_and_cannot_be_changed(client, operator):
    usage.record({("acme", "chat", "r1"): Counted(3, 12, 34)})
    client.force_login(operator)
    page = client.get("/admin/gateway/usage/?tenant=acme")
    assert page.status_code == 200 and "34" in page.content.decode()
    row = Usage.objects.get()
    assert client.post(f"/admin/gateway/usage/{row.pk}/delete/", {"post": "yes"}).status_code == 403
    assert client.get("/admin/gateway/usage/add/").status_code == 403
