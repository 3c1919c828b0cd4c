"""Tenants through the operators API: limits set, changed, cleared, refused with the field named, logged; usage read."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.contrib.admin.models import CHANGE, LogEntry
from django.utils import timezone

from gateway import usage, wanted
from gateway.models import Tenant
from gateway.usage import Counted
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


def test_usage_is_summed_per_tenant_model_and_replica_since_a_time(operate):
    now = timezone.now()
    usage.record({("acme", "chat", "r1"): Counted(2, 10, 20), ("other", "chat", "r1"): Counted(1, 1, 1)}, now=now)
    usage.record({("acme", "chat", "r1"): Counted(1, 5, 5)}, now=now - timedelta(hours=1))
    usage.record({("acme", "chat", "r1"): Counted(9, 99, 99)}, now=now - timedelta(days=3))
    answer = operate.get("/usage/", tenant="acme", since="24h").json()
    assert answer["rows"] == [
        {
            "tenant": "acme",
            "model": "chat",
            "replica": "r1",
            "requests": 3,
            "prompt_tokens": 15,
            "completion_tokens": 25,
        }
    ]
    assert len(operate.get("/usage/", since="7d").json()["rows"]) == 2
    refused = operate.get("/usage/", since="a while")
    assert refused.status_code == 400 and "since" in str(refused.json())
