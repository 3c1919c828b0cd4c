"""Every page carries the security headers; the policy forbids inline scripts."""

import pytest

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize("path", ["/admin/login/", "/healthz"])
def test_security_headers_on_every_response(client, path):
    response = client.get(path)
    policy = response["Content-Security-Policy"]
    directives = dict(part.strip().split(" ", 1) for part in policy.split(";"))
    assert directives["script-src"] == "'self'"
    assert "unsafe-inline" not in directives["script-src"]
    assert directives["frame-ancestors"] == "'none'"
    assert response["X-Content-Type-Options"] == "nosniff"
    assert response["X-Frame-Options"] == "DENY"
    assert response["Referrer-Policy"] == "same-origin"


def test_admin_login_page_has_no_inline_script(client):
    import re

    body = client.get("/admin/login/").content.decode()
    for tag in re.findall(r"<script[^>]*>", body):
        assert "src=" in tag or 'type="application/json"' in tag, tag


@pytest.mark.parametrize(
    "path",
    ["/admin/", "/admin/inventory/node/", "/admin/inventory/node/ready-1/change/", "/admin/inventory/nodeevent/"],
)
def test_admin_pages_carry_the_headers_and_no_inline_script(client, operator, cluster, path):
    import re

    client.force_login(operator)
    response = client.get(path)
    assert response.status_code == 200
    assert "script-src 'self'" in response["Content-Security-Policy"]
    assert response["X-Content-Type-Options"] == "nosniff"
    assert response["X-Frame-Options"] == "DENY"
    for tag in re.findall(r"<script[^>]*>", response.content.decode()):
        assert "src=" in tag or 'type="application/json"' in tag, tag


@pytest.mark.parametrize(("method", "path"), [("get", "/metrics"), ("post", "/api/v1/heartbeat")])
def test_machine_endpoints_are_not_sniffable_or_frameable(client, redis_client, method, path):
    response = getattr(client, method)(path)
    assert response["X-Content-Type-Options"] == "nosniff"
    assert response["X-Frame-Options"] == "DENY"
