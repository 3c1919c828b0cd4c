"""An operator at the admin: logs in with a real session and posts cordon, drain and uncordon with CSRF.

The soak's stack runs with production settings (DEBUG off) behind its HAProxy,
which sets `X-Forwarded-Proto` itself (http: it ends no TLS here) whatever a
client sends, so requests carry the plain-HTTP `Origin` and `Referer` Django's
CSRF check compares with, and the session and CSRF cookies (marked Secure, as in
production) are carried by hand since this client speaks plain HTTP.
"""

from __future__ import annotations

import re
from http.cookiejar import DefaultCookiePolicy

import requests


class AdminError(RuntimeError):
    pass


class Operator:
    def __init__(self, base_url: str, username: str, password: str, timeout: float = 15.0):
        self.base = base_url.rstrip("/")
        self.username, self.password = username, password
        self.timeout = timeout
        self.session = requests.Session()
        # The session's jar would refuse to send Secure cookies over http: keep them ourselves.
        self.session.cookies.set_policy(DefaultCookiePolicy(allowed_domains=[]))
        self.cookies: dict[str, str] = {}
        host = self.base.split("://", 1)[1]
        self.session.headers.update({"Origin": f"http://{host}"})
        self.logged_in = False

    def _keep_cookies(self, response: requests.Response) -> None:
        for cookie in response.cookies:
            self.cookies[cookie.name] = cookie.value or ""

    def _get(self, path: str) -> requests.Response:
        response = self.session.get(self.base + path, cookies=self.cookies, timeout=self.timeout, allow_redirects=False)
        self._keep_cookies(response)
        return response

    def _post(self, path: str, data: dict | list) -> requests.Response:
        token = self.cookies.get("csrftoken", "")
        if isinstance(data, dict):
            data = list(data.items())
        response = self.session.post(
            self.base + path,
            data=[*data, ("csrfmiddlewaretoken", token)],
            cookies=self.cookies,
            headers={"Referer": f"{self.base}{path}"},
            timeout=self.timeout,
            allow_redirects=False,
        )
        self._keep_cookies(response)
        return response

    def login(self) -> None:
        page = self._get("/admin/login/")
        if page.status_code != 200 or "csrftoken" not in self.cookies:
            raise AdminError(f"login page answered {page.status_code}")
        response = self._post(
            "/admin/login/?next=/admin/", {"username": self.username, "password": self.password, "next": "/admin/"}
        )
        if response.status_code != 302 or "sessionid" not in self.cookies:
            raise AdminError(f"login answered {response.status_code}: {_error(response)}")
        self.logged_in = True

    def act(self, action: str, node_ids: list[str], reason: str) -> None:
        """Apply an admin action (cordon, drain, uncordon) to nodes, with its reason, as the form does."""
        if not self.logged_in:
            self.login()
        data = [("action", action), ("apply", "1"), ("reason", reason)]
        data += [("_selected_action", node_id) for node_id in node_ids]
        response = self._post("/admin/inventory/node/", data)
        if response.status_code == 302 and "/login/" in response.headers.get("Location", ""):
            self.logged_in = False
            raise AdminError("the session was lost")
        if response.status_code != 302:
            raise AdminError(f"{action} answered {response.status_code}: {_error(response)}")
        # The action redirects back to the list, whose message says how many changed.
        listing = self._get(response.headers["Location"] if response.headers.get("Location") else "/admin/")
        if listing.status_code != 200:
            raise AdminError(f"the node list answered {listing.status_code} after {action}")


def _error(response: requests.Response) -> str:
    found = re.search(r'class="errornote">\s*([^<]+)', response.text or "")
    return found.group(1).strip() if found else (response.text or "")[:120]
