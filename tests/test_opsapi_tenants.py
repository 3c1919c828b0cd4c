"""A tenant's limits through the operators' API: set, changed, cleared, refused with the field named, logged."""

from __future__ import annotations

import pytest
from django.contrib.admin.models import CHANGE, LogEntry

from gateway import wanted
from gateway.models import Tenant
from tests.opsapi_support import Caller, make_token

pytestmark = pytest.mark.django_db


@pytest.fixture
def operate(client, operator):
    _, secret = make_token(operator, scope="operate", name="tenants")
    return Caller(client, secret)


def test_limits_are_set_at_creation_changed_and_cleared_and_reach_the_gateways_maps(operate):
    made = operate.post("/tenants/", {"name": "acme", "requests_per_second": 5})
    assert made.status_code == 201, made.json()
    assert made.json()["requests_per_second"] == 5 and made.json()["concurrent_requests"] is None
    assert wanted.read().requests_per_second == {"acme": "5"}
    changed = operate.patch("/tenants/acme/", {"requests_per_second": None, "concurrent_requests": 2})
    assert changed.status_code == 200, changed.json()
    assert changed.json()["requests_per_second"] is None and changed.json()["concurrent_requests"] == 2
    desired = wanted.read()
    assert desired.requests_per_second == {} and desired.concurrent_requests == {"acme": "2"}
    assert operate.get("/tenants/acme/").json()["concurrent_requests"] == 2
    assert LogEntry.objects.filter(action_flag=CHANGE, change_message__contains="concurrent_requests 2").exists()


def test_an_inactive_tenants_limits_leave_the_maps_with_its_keys(operate):
    Tenant.objects.create(name="acme", requests_per_second=0, concurrent_requests=1)
    assert wanted.read().requests_per_second == {"acme": "0"}
    assert operate.patch("/tenants/acme/", {"active": False}).status_code == 200
    desired = wanted.read()
    assert desired.requests_per_second == {} and desired.concurrent_requests == {}


@pytest.mark.parametrize(
    ("data", "field"),
    [
        ({"requests_per_second": -1}, "requests_per_second"),
        ({"concurrent_requests": "many"}, "concurrent_requests"),
        ({"active": "perhaps"}, "active"),
    ],
)
def test_a_bad_limit_names_its_field(operate, data, field):
    Tenant.objects.create(name="acme")
    answer = operate.patch("/tenants/acme/", data)
    assert answer.status_code == 400
    assert field in str(answer.json())
    assert Tenant.objects.get().requests_per_second is None


def test_an_unknown_tenant_is_404_and_a_read_token_cannot_change_one(operate, client, operator):
    assert operate.patch("/tenants/nobody/", {"requests_per_second": 1}).status_code == 404
    Tenant.objects.create(name="acme")
    _, secret = make_token(operator, scope="read", name="look")
    assert Caller(client, secret).patch("/tenants/acme/", {"requests_per_second": 1}).status_code == 403
    assert Tenant.objects.get().requests_per_second is None
