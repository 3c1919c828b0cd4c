"""What the operators' API tests share: tokens made the way the Tokens page makes them, and a caller."""

from __future__ import annotations

import json

from django.test import Client

from devstack.faults import database_unreachable
from devstack.polling import wait_until
from devstack.ports import free_port
from livestate import loadstore
from opsapi.forms import NewTokenForm
from opsapi.models import ApiToken
from tests.factories import make_inventory

__all__ = [
    "API",
    "Caller",
    "database_unreachable",
    "free_port",
    "loadstore",
    "make_inventory",
    "make_token",
    "wait_until",
]

API = "/api/ops/v1"


def make_token(user, scope: str = "read", days: int = 30, name: str = "laptop") -> tuple[ApiToken, str]:
    form = NewTokenForm({"name": name, "scope": scope, "lifetime_days": days}, user=user)
    assert form.is_valid(), form.errors
    return form.make()


class Caller:
    """A client that sends one token with every request to the API."""

    def __init__(self, client: Client, secret: str, address: str = "127.0.0.1"):
        self.client = client
        self.headers = {"HTTP_AUTHORIZATION": f"Bearer {secret}", "REMOTE_ADDR": address}

    def get(self, path: str, **query):
        return self.client.get(API + path, query, **self.headers)

    def post(self, path: str, data: dict):
        return self.client.post(API + path, json.dumps(data), content_type="application/json", **self.headers)

    def patch(self, path: str, data: dict):
        return self.client.patch(API + path, json.dumps(data), content_type="application/json", **self.headers)

    def delete(self, path: str):
        return self.client.delete(API + path, **self.headers)
