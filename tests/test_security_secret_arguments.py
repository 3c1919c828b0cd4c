"""A deployment's secret arguments are shown only to those who may change it (issue 22, item 9).

The attack: a read token of a user who is not staff listed the deployments and
read `--api-key sk-live-…` from their arguments.
"""

from __future__ import annotations

import pytest
from django.contrib.auth.models import Permission
from django.test import Client

from inventory.models import Deployment
from inventory.models.deployments import SECRET_ARGUMENTS
from tests.opsapi_support import Caller, make_token

pytestmark = pytest.mark.django_db

KEY = "sk-live-0123456789abcdef"


@pytest.fixture
def secret_deployment():
    return Deployment.objects.create(
        name="llama", model_source="llama", engine="vllm", arguments=f"--api-key {KEY}", secret_arguments=True
    )


def caller_of(user, scope: str) -> Caller:
    return Caller(Client(), make_token(user, scope=scope)[1])


def test_a_read_token_of_a_non_staff_user_does_not_see_secret_arguments(viewer, secret_deployment):
    caller = caller_of(viewer, "read")
    listed = caller.get("/deployments/")
    one = caller.get("/deployments/llama/")
    assert listed.status_code == one.status_code == 200
    assert KEY not in listed.content.decode() + one.content.decode()
    assert one.json()["arguments"] == SECRET_ARGUMENTS
    assert one.json()["secret_arguments"] is True


def test_a_read_token_does_not_see_them_even_of_one_who_may_change_them(operator, secret_deployment):
    assert KEY not in caller_of(operator, "read").get("/deployments/llama/").content.decode()


def test_an_operate_token_of_one_who_may_change_the_deployment_sees_them(operator, secret_deployment):
    assert caller_of(operator, "operate").get("/deployments/llama/").json()["arguments"] == f"--api-key {KEY}"


def test_arguments_not_marked_secret_are_shown_to_every_reader(viewer):
    Deployment.objects.create(name="open", model_source="m", engine="vllm", arguments="--max-model-len 4096")
    assert caller_of(viewer, "read").get("/deployments/open/").json()["arguments"] == "--max-model-len 4096"


def test_a_deployment_made_through_the_api_may_be_marked_secret(operator):
    body = {"name": "keyed", "model_source": "m", "engine": "vllm", "arguments": f"--api-key {KEY}"}
    created = caller_of(operator, "operate").post("/deployments/", {**body, "secret_arguments": True})
    assert created.status_code == 201, created.content
    assert Deployment.objects.get(name="keyed").secret_arguments


def test_the_admin_shows_them_to_who_may_change_and_hides_them_from_who_may_only_view(
    client, django_user_model, operator, secret_deployment
):
    page = f"/admin/inventory/deployment/{secret_deployment.pk}/change/"
    watcher = django_user_model.objects.create_user("watcher", is_staff=True)
    watcher.user_permissions.add(Permission.objects.get(codename="view_deployment"))
    client.force_login(watcher)
    shown = client.get(page)
    assert shown.status_code == 200
    assert KEY not in shown.content.decode() and SECRET_ARGUMENTS in shown.content.decode()
    client.force_login(operator)
    assert KEY in client.get(page).content.decode()
