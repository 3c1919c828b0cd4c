"""Who may call the operators' API: personal tokens, their scope, expiry and revocation, and the failure limit."""

from __future__ import annotations

from datetime import timedelta

import pytest
import time_machine
from django.utils import timezone

from opsapi.models import ApiToken
from tests.opsapi_support import API, Caller, make_token

pytestmark = pytest.mark.django_db


def test_no_token_is_a_401_in_json(client):
    response = client.get(f"{API}/nodes/")
    assert response.status_code == 401
    assert response.json()["field"] == "authorization"
    assert response["WWW-Authenticate"].startswith("Bearer")


def test_a_token_is_kept_as_a_digest_only(viewer):
    token, secret = make_token(viewer)
    stored = ApiToken.objects.get(pk=token.pk)
    assert secret.startswith("llmgw-ops-") and secret.split(".", 1)[1] not in stored.secret_digest
    assert ApiToken.find(secret) == stored
    assert ApiToken.find(secret + "x") is None


def test_a_read_token_reads_and_records_when_it_was_used(client, viewer, cluster):
    token, secret = make_token(viewer)
    response = Caller(client, secret).get("/me/")
    assert response.status_code == 200
    assert response.json()["user"] == "viewer" and response.json()["token"]["scope"] == "read"
    token.refresh_from_db()
    assert token.last_used_at is not None


def test_a_revoked_token_is_refused(client, viewer):
    token, secret = make_token(viewer)
    token.revoke("viewer")
    assert Caller(client, secret).get("/me/").status_code == 401


def test_an_expired_token_is_refused(client, viewer):
    _, secret = make_token(viewer, days=7)
    with time_machine.travel(timezone.now() + timedelta(days=7, seconds=1)):
        assert Caller(client, secret).get("/me/").status_code == 401


def test_the_token_of_a_deactivated_user_is_refused(client, viewer):
    _, secret = make_token(viewer)
    viewer.is_active = False
    viewer.save()
    assert Caller(client, secret).get("/me/").status_code == 401


def test_a_garbled_header_is_a_401_not_a_500(client):
    for header in ("Bearer", "Bearer a b", "Basic dXNlcjpwYXNz", "Bearer llmgw-ops-zz.x", "Bearer \u00e9"):
        response = client.get(f"{API}/me/", HTTP_AUTHORIZATION=header)
        assert response.status_code == 401, header


def test_refused_tokens_slow_the_guesser_but_never_refuse_a_good_token(client, viewer, settings, redis_client):
    settings.LLMGW_AUTH_FAILURES_PER_MINUTE = 3
    _, secret = make_token(viewer)
    wrong = Caller(client, "llmgw-ops-0000000000000000.wrong", "10.0.0.9")
    for _ in range(3):
        assert wrong.get("/me/").status_code == 401
    locked = wrong.get("/me/")
    assert locked.status_code == 429
    assert int(locked["Retry-After"]) > 0
    # An operator behind the same address (one proxy, one NAT) is not locked out by the guesser.
    assert Caller(client, secret, "10.0.0.9").get("/me/").status_code == 200


def test_a_read_token_cannot_act(client, operator, cluster):
    _, secret = make_token(operator, scope="read")
    caller = Caller(client, secret)
    response = caller.post("/node-actions/", {"action": "cordon", "reason": "kernel", "nodes": ["ready-1"]})
    assert response.status_code == 403
    assert "only read" in response.json()["error"]
    assert caller.patch("/deployments/x/", {"replicas": 2}).status_code == 403
    assert caller.delete("/deployments/x/").status_code == 403


def test_an_operate_token_stops_acting_when_its_user_is_no_longer_staff(client, operator, cluster):
    _, secret = make_token(operator, scope="operate")
    operator.is_staff = False
    operator.save()
    response = Caller(client, secret).post(
        "/node-actions/", {"action": "cordon", "reason": "kernel", "nodes": ["ready-1"]}
    )
    assert response.status_code == 403
    cluster["ready-1"].refresh_from_db()
    assert cluster["ready-1"].admin_state == "active"


def test_a_viewer_cannot_make_an_operate_token(viewer):
    from opsapi.forms import NewTokenForm

    form = NewTokenForm({"name": "x", "scope": "operate", "lifetime_days": 30}, user=viewer)
    assert not form.is_valid()
    assert "scope" in form.errors
