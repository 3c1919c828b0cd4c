"""`manage.py ensure_admin`, as `make run` calls it on its first run: the password on stdin, never in argv."""

from __future__ import annotations

import io

import pytest
from django.contrib.auth import authenticate
from django.core.management import call_command
from django.core.management.base import CommandError
from django.test import RequestFactory

pytestmark = pytest.mark.django_db


def test_the_password_is_read_from_stdin_even_one_beginning_with_a_dash():
    # secrets.token_urlsafe begins with "-" one time in 64.
    out = io.StringIO()
    call_command("ensure_admin", "--password-stdin", stdin=io.StringIO("-x7Qk2vR9pLm3\n"), stdout=out)
    assert out.getvalue().strip() == "created"
    # django-axes counts logins by request, so authenticate needs one.
    login = RequestFactory().post("/admin/login/")
    assert authenticate(login, username="admin", password="-x7Qk2vR9pLm3") is not None


def test_a_password_on_the_command_line_is_refused():
    """`ps` shows a command line to every user of the machine (issue 22, item 10)."""
    with pytest.raises(CommandError):
        call_command("ensure_admin", "--password=visible-to-ps")


def test_an_empty_stdin_creates_nobody():
    with pytest.raises(CommandError, match="no password"):
        call_command("ensure_admin", "--password-stdin", stdin=io.StringIO(""))


def test_an_existing_superuser_is_left_alone(operator):
    out = io.StringIO()
    call_command("ensure_admin", "--password-stdin", stdin=io.StringIO("whatever\n"), stdout=out)
    assert out.getvalue().strip() == "exists"
