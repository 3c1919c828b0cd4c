"""The operator pages from an attacker's side: sign-in, who may act, CSRF, escaping, headers, token.

The hostile node reports through the real agent API, so every string an agent
controls passes the same way it would in production before a page renders it.
"""

from __future__ import annotations

import re

import pytest
from django.test import Client

from inventory.models import AdminState, Node
from tests.test_security_admin import HOSTILE, assert_escaped, hostile_node  # noqa: F401 (a fixture)

pytestmark = pytest.mark.django_db

PAGES = ["/", "/?q=evil", "/nodes/evil-1/", "/nodes/evil-1/charts/"]


@pytest.mark.parametrize("path", PAGES)
def test_anonymous_visitors_are_sent_to_sign_in(client, hostile_node, path):  # noqa: F811
    response = client.get(path)
    assert response.status_code == 302
    assert response["Location"].startswith("/admin/login/")
    assert HOSTILE["hostname"] not in response.content.decode()


@pytest.mark.parametrize("path", PAGES)
def test_an_htmx_poll_without_a_session_gets_no_data(client, hostile_node, path):  # noqa: F811
    response = client.get(path, headers={"HX-Request": "true"})
    assert response.status_code in (200, 302)
    assert "evil-1" not in response.content.decode()


@pytest.mark.parametrize("path", ["/", "/?q=evil", "/nodes/evil-1/"])
@pytest.mark.parametrize("htmx", [False, True])
def test_agent_reported_markup_is_escaped_on_the_pages(client, viewer, hostile_node, path, htmx):  # noqa: F811
    client.force_login(viewer)
    response = client.get(path, headers={"HX-Request": "true"} if htmx else {})
    assert response.status_code == 200
    assert_escaped(response.content.decode())


def test_the_node_page_shows_hostile_strings_as_text(client, viewer, hostile_node):  # noqa: F811
    client.force_login(viewer)
    body = client.get("/nodes/evil-1/").content.decode()
    assert "&lt;script&gt;alert(&quot;hostname&quot;)&lt;/script&gt;" in body


@pytest.mark.parametrize("path", ["/", "/nodes/evil-1/"])
def test_pages_carry_the_security_headers_and_no_inline_script(client, viewer, hostile_node, path):  # noqa: F811
    client.force_login(viewer)
    response = client.get(path)
    policy = dict(part.strip().split(" ", 1) for part in response["Content-Security-Policy"].split(";"))
    assert policy["script-src"] == "'self'"
    assert policy["frame-ancestors"] == "'none'"
    assert response["X-Content-Type-Options"] == "nosniff"
    assert response["X-Frame-Options"] == "DENY"
    for tag in re.findall(r"<script[^>]*>", response.content.decode()):
        assert "src=" in tag or 'type="application/json"' in tag, tag
    assert not re.search(r"\son[a-z]+\s*=", _tags_only(response.content.decode())), "an inline event handler"


def _tags_only(body: str) -> str:
    """The markup's tags without text or quoted attribute values, where escaped agent strings may sit."""
    tags = " ".join(re.findall(r"<[a-zA-Z][^>]*>", body))
    return re.sub(r'"[^"]*"|\'[^\']*\'', '""', tags)


def cordon_form(reason: str = "testing") -> dict:
    return {"action": "cordon", "reason": reason}


def test_a_viewer_cannot_cordon_from_the_node_page(client, viewer, cluster):
    client.force_login(viewer)
    response = client.post("/nodes/ready-1/admin-state/", cordon_form())
    assert response.status_code == 403
    assert Node.objects.get(pk="ready-1").admin_state == AdminState.ACTIVE


def test_anonymous_cannot_cordon(client, cluster):
    response = client.post("/nodes/ready-1/admin-state/", cordon_form())
    assert response.status_code == 302
    assert Node.objects.get(pk="ready-1").admin_state == AdminState.ACTIVE


def test_the_node_page_action_refuses_a_forged_post(operator, cluster):
    browser = Client(enforce_csrf_checks=True)
    browser.force_login(operator)
    assert browser.post("/nodes/ready-1/admin-state/", cordon_form()).status_code == 403
    assert Node.objects.get(pk="ready-1").admin_state == AdminState.ACTIVE
    # The page gives the token; with it the same post goes through.
    browser.get("/nodes/ready-1/")
    token = browser.cookies["csrftoken"].value
    response = browser.post("/nodes/ready-1/admin-state/", {**cordon_form(), "csrfmiddlewaretoken": token})
    assert response.status_code == 302
    assert Node.objects.get(pk="ready-1").admin_state == AdminState.CORDONED


def test_the_node_page_action_accepts_no_get(client, operator, cluster):
    client.force_login(operator)
    assert client.get("/nodes/ready-1/admin-state/?action=cordon&reason=x").status_code == 405
    assert Node.objects.get(pk="ready-1").admin_state == AdminState.ACTIVE


@pytest.mark.parametrize("path", ["/metrics", "/api/v1/prometheus/targets"])
def test_fleet_endpoints_are_behind_the_metrics_token_when_set(client, cluster, redis_client, settings, path):
    settings.LLMGW_METRICS_TOKEN = "s3cret-metrics-token"
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "Basic s3cret-metrics-token"}):
        response = client.get(path, headers=headers)
        assert response.status_code == 401, headers
        assert "ready-1" not in response.content.decode()
    assert client.get(path, headers={"Authorization": "Bearer s3cret-metrics-token"}).status_code == 200
