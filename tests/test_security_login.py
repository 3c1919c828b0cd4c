"""Password guessing: django-axes locks a user name, or an address, after too many wrong passwords.

The pages send visitors to the admin's login form, so that one form is every login
there is; these tests go through it as a browser does (CSRF cookie, form post).
"""

from __future__ import annotations

import pytest
from django.conf import settings
from django.core.management import call_command
from django.test import Client

pytestmark = pytest.mark.django_db

LOGIN = "/admin/login/"


def attempt(client: Client, username: str, password: str, address: str = "192.0.2.10"):
    client.get(LOGIN, REMOTE_ADDR=address)
    return client.post(
        LOGIN,
        {"username": username, "password": password, "next": "/admin/"},
        REMOTE_ADDR=address,
    )


def fail_until_the_limit(username: str, address: str = "192.0.2.10") -> None:
    # Each attempt from a fresh client: a session or cookie must not be what is counted.
    for _ in range(settings.AXES_FAILURE_LIMIT - 1):
        assert attempt(Client(), username, "wrong-pass", address).status_code == 200
    # The failure that reaches the limit is answered with the lockout already.
    assert attempt(Client(), username, "wrong-pass", address).status_code == 429


def test_the_pages_send_visitors_to_the_limited_form(client):
    response = client.get("/")
    assert response.status_code == 302
    assert response["Location"].startswith(LOGIN)


def test_the_right_password_is_refused_while_the_user_is_locked_out(client, operator):
    fail_until_the_limit("operator")
    response = attempt(client, "operator", "operator-pass")
    assert response.status_code == 429
    body = response.content.decode()
    assert "Too many failed logins" in body
    assert "even the right password is refused" in body
    assert "_auth_user_id" not in client.session


def test_one_user_name_is_locked_whatever_address_it_comes_from(client, operator):
    for n in range(settings.AXES_FAILURE_LIMIT):
        attempt(Client(), "operator", "wrong-pass", address=f"198.51.100.{n + 1}")
    assert attempt(client, "operator", "operator-pass", address="203.0.113.99").status_code == 429


def test_one_address_is_locked_whatever_user_names_it_tries(client, operator):
    for n in range(settings.AXES_FAILURE_LIMIT):
        attempt(Client(), f"guess-{n}", "wrong-pass", address="192.0.2.66")
    assert attempt(client, "operator", "operator-pass", address="192.0.2.66").status_code == 429
    # Another address is not touched by that lockout.
    assert attempt(Client(), "operator", "operator-pass", address="192.0.2.67").status_code == 302


def test_an_operator_clears_the_lockout(client, operator):
    fail_until_the_limit("operator")
    assert attempt(Client(), "operator", "operator-pass").status_code == 429
    call_command("axes_reset", verbosity=0)
    response = attempt(client, "operator", "operator-pass")
    assert response.status_code == 302
    assert "_auth_user_id" in client.session


def test_the_admin_lists_attempts_so_an_operator_can_clear_them_there(client, operator):
    fail_until_the_limit("operator")
    # The lockout is per user name and per address, so the operator logs in from elsewhere
    # under another account.
    client.force_login(
        type(operator).objects.create_user("second", password="second-pass", is_staff=True, is_superuser=True)
    )
    response = client.get("/admin/axes/accessattempt/")
    assert response.status_code == 200
    assert "operator" in response.content.decode()


def test_a_success_below_the_limit_forgets_the_failures(client, operator):
    for _ in range(settings.AXES_FAILURE_LIMIT - 1):
        attempt(Client(), "operator", "wrong-pass")
    assert attempt(Client(), "operator", "operator-pass").status_code == 302
    for _ in range(settings.AXES_FAILURE_LIMIT - 1):
        attempt(Client(), "operator", "wrong-pass")
    assert attempt(client, "operator", "operator-pass").status_code == 302
