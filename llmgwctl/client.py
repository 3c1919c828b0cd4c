"""The API over HTTP: one session, one-line errors, and an exit code for each kind of failure."""

from __future__ import annotations

from typing import Any

import requests

from llmgw_transport import InsecureUrl, check_url, verify
from llmgwctl import __version__

PREFIX = "/api/ops/v1"
TIMEOUT = 15

# Exit codes (docs/api.md lists them).
OK = 0
REFUSED = 1  # the API refused the request (a mistake in it)
USAGE = 2  # the command line itself was wrong
AUTH = 3  # not logged in, token refused, or not allowed
NOT_FOUND = 4
TIMED_OUT = 5  # --wait gave up
UNREACHABLE = 6  # no answer, or the control plane failed


class Failure(Exception):
    """Anything that ends the command: a one-line message and an exit code."""

    def __init__(self, message: str, code: int):
        super().__init__(message)
        self.code = code


def code_for(status: int) -> int:
    if status in (401, 403, 429):
        return AUTH
    if status == 404:
        return NOT_FOUND
    if status >= 500:
        return UNREACHABLE
    return REFUSED


class Client:
    def __init__(self, url: str, token: str, ca_file: str = "", allow_insecure_http: bool = False):
        # The token acts as its owner: never sent in the clear, nor to a server whose certificate is not checked.
        try:
            check_url(url, allow_insecure_http)
            checked = verify(ca_file)
        except InsecureUrl as exc:
            raise Failure(f"{url}: {exc} (llmgw login --allow-insecure-http)", USAGE) from None
        self.url = url.rstrip("/")
        self.session = requests.Session()
        # Passed with each request: requests lets REQUESTS_CA_BUNDLE in the environment override a session's.
        self.verify = checked
        self.session.headers["Authorization"] = f"Bearer {token}"
        self.session.headers["User-Agent"] = f"llmgw/{__version__}"

    def request(self, method: str, path: str, **kwargs: Any) -> requests.Response:
        try:
            response = self.session.request(
                method, self.url + PREFIX + path, timeout=TIMEOUT, verify=self.verify, **kwargs
            )
        except requests.RequestException as exc:
            raise Failure(f"cannot reach {self.url}: {type(exc).__name__}", UNREACHABLE) from None
        if response.status_code >= 400:
            raise Failure(f"{response.status_code}: {_message(response)}", code_for(response.status_code))
        return response

    def get(self, path: str, **params: Any) -> requests.Response:
        return self.request("GET", path, params={k: v for k, v in params.items() if v not in (None, "")})

    def post(self, path: str, body: dict) -> requests.Response:
        return self.request("POST", path, json=body)

    def patch(self, path: str, body: dict) -> requests.Response:
        return self.request("PATCH", path, json=body)

    def delete(self, path: str) -> requests.Response:
        return self.request("DELETE", path)


def _message(response: requests.Response) -> str:
    try:
        body = response.json()
    except ValueError:
        return response.reason or "error"
    if isinstance(body, dict) and isinstance(body.get("error"), str):
        return body["error"]
    return response.reason or "error"
