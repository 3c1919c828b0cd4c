"""Tenants and API keys through the operators' API: made with operate tokens (the key shown once), listed, revoked."""

from __future__ import annotations

import pytest
from django.contrib.admin.models import ADDITION, CHANGE, LogEntry

from gateway.models import ApiKey, Tenant, key_digest
from tests.opsapi_support import Caller, make_token

pytestmark = pytest.mark.django_db


@pytest.fixture
def operate(client, operator):
    _, secret = make_token(operator, scope="operate", name="keys")
    return Caller(client, secret)


@pytest.fixture
def read(client, operator):
    _, secret = make_token(operator, scope="read", name="look")
    return Caller(client, secret)


def test_a_key_is_made_shown_once_stored_as_a_digest_and_logged(operate):
    assert operate.post("/tenants/", {"name": "acme"}).status_code == 201
    answer = operate.post("/keys/", {"tenant": "acme", "name": "billing"})
    assert answer.status_code == 201, answer.json()
    made = answer.json()
    stored = ApiKey.objects.get(pk=made["id"])
    assert stored.digest == key_digest(made["key"])
    assert made["key"].startswith(made["prefix"]) and made["prefix"] == stored.prefix
    assert made["key"] not in str(ApiKey.objects.values_list().get(pk=made["id"]))
    listed = operate.get("/keys/", tenant="acme").json()
    assert [k["prefix"] for k in listed] == [made["prefix"]] and "key" not in listed[0]
    assert LogEntry.objects.filter(action_flag=ADDITION, object_repr__startswith=made["prefix"]).exists()


def test_revoking_is_once_logged_and_leaves_the_key_unusable(operate):
    tenant = Tenant.objects.create(name="acme")
    made = operate.post("/keys/", {"tenant": tenant.name}).json()
    assert operate.delete(f"/keys/{made['id']}/").json()["revoked_at"] is not None
    assert operate.delete(f"/keys/{made['id']}/").status_code == 200
    assert not ApiKey.objects.usable().exists()
    assert LogEntry.objects.filter(action_flag=CHANGE, change_message__startswith="revoked").count() == 1
    assert operate.delete("/keys/999999/").status_code == 404


@pytest.mark.parametrize(
    ("data", "field"),
    [
        ({"tenant": "nobody"}, "tenant"),
        ({"tenant": "acme", "expires_at": "2001-01-01T00:00:00Z"}, "expires_at"),
        ({"tenant": "acme", "expires_at": "soon"}, "expires_at"),
    ],
)
def test_a_bad_key_request_names_its_field(operate, data, field):
    Tenant.objects.create(name="acme")
    answer = operate.post("/keys/", data)
    assert answer.status_code == 400
    assert field in str(answer.json())


def test_a_tenant_name_must_be_one_safe_word(operate):
    assert operate.post("/tenants/", {"name": "two words"}).status_code == 400
    assert operate.post("/tenants/", {"name": "acme"}).status_code == 201
    assert operate.post("/tenants/", {"name": "acme"}).status_code == 400


def test_a_read_token_lists_but_cannot_make_or_revoke(read):
    Tenant.objects.create(name="acme")
    assert read.get("/tenants/").json()[0]["name"] == "acme"
    assert read.post("/keys/", {"tenant": "acme"}).status_code == 403
    assert read.delete("/keys/1/").status_code == 403
