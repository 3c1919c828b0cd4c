"""Issue 22, item 1: one permission must not grow into another user's, through the admin or the API.

The attack: a staff user holding only "add API token" made an `operate` token
for a superuser in the admin, was shown its secret, and deployed a command to
every node as that superuser.
"""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.contrib.auth.models import Permission
from django.test import Client
from django.utils import timezone

from inventory.models import Deployment
from opsapi.models import PREFIX, ApiToken
from tests.opsapi_support import Caller, make_token

SECRET_SHOWN = re.compile(re.escape(PREFIX) + r"[0-9a-f]+\.\S+")
ROOT_ON_EVERY_NODE = {"name": "pwn", "model_source": "m", "engine": "command", "arguments": "/bin/sh -c id"}


@pytest.fixture
def token_clerk(django_user_model):
    """Staff with exactly one permission: to add API tokens."""
    clerk = django_user_model.objects.create_user("clerk", password="clerk-pass", is_staff=True)
    clerk.user_permissions.add(Permission.objects.get(codename="add_apitoken"))
    return clerk


def admin_add_token(client: Client, owner, scope: str = "operate"):
    expires = (timezone.now() + timedelta(days=30)).strftime("%Y-%m-%d %H:%M:%S")
    return client.post(
        "/admin/opsapi/apitoken/add/",
        {"user": owner.pk, "name": "mine", "scope": scope, "expires_at_0": expires[:10], "expires_at_1": expires[11:]},
        follow=True,
    )


def test_staff_with_add_token_cannot_make_a_token_for_a_superuser(client, token_clerk, operator):
    client.force_login(token_clerk)
    response = admin_add_token(client, operator)
    assert response.status_code == 200
    assert not ApiToken.objects.filter(user=operator).exists()
    assert not SECRET_SHOWN.search(response.content.decode())
    assert b"Select a valid choice" in response.content


def test_staff_with_add_token_may_make_their_own_but_it_acts_only_with_their_rights(client, token_clerk, cluster):
    client.force_login(token_clerk)
    response = admin_add_token(client, token_clerk)
    secret = SECRET_SHOWN.search(response.content.decode()).group(0)
    assert ApiToken.objects.get().user == token_clerk
    caller = Caller(Client(), secret)
    assert caller.get("/me/").json()["user"] == "clerk"
    refused = caller.post("/deployments/", ROOT_ON_EVERY_NODE)
    assert refused.status_code == 403 and "add_deployment" in refused.json()["error"]
    assert not Deployment.objects.exists()


def test_a_superuser_may_make_a_token_for_another_user_but_is_not_shown_its_secret(client, operator, viewer):
    client.force_login(operator)
    response = admin_add_token(client, viewer, scope="read")
    assert ApiToken.objects.get().user == viewer
    assert not SECRET_SHOWN.search(response.content.decode())
    assert b"shown to nobody" in response.content


def test_the_owner_being_superuser_does_not_widen_a_read_token(operator, cluster):
    _, secret = make_token(operator, scope="read")
    refused = Caller(Client(), secret).post("/deployments/", ROOT_ON_EVERY_NODE)
    assert refused.status_code == 403
    assert not Deployment.objects.exists()
