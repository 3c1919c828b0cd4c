"""`manage.py ensure_admin`, as `make run` calls it on its first run."""

from __future__ import annotations

import io

import pytest
from django.contrib.auth import authenticate
from django.core.management import call_command
from django.test import RequestFactory

from devstack.stack import ensure_admin_arguments

pytestmark = pytest.mark.django_db


def test_a_password_beginning_with_a_dash_is_taken_as_the_password(settings, tmp_path):
    # secrets.token_urlsafe begins with "-" one time in 64.
    settings.VAR_DIR = tmp_path
    out = io.StringIO()
    call_command(*ensure_admin_arguments("-x7Qk2vR9pLm3"), stdout=out)
    assert out.getvalue().strip() == "created"
    # django-axes counts logins by request, so authenticate needs one.
    login = RequestFactory().post("/admin/login/")
    assert authenticate(login, username="admin", password="-x7Qk2vR9pLm3") is not None
    assert (tmp_path / "admin-password").read_text() == "admin -x7Qk2vR9pLm3\n"


def test_an_existing_superuser_is_left_alone(settings, tmp_path, operator):
    settings.VAR_DIR = tmp_path
    out = io.StringIO()
    call_command("ensure_admin", "--password=whatever", stdout=out)
    assert out.getvalue().strip() == "exists"
    assert not (tmp_path / "admin-password").exists()
