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
