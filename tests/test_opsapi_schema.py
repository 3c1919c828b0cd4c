"""The OpenAPI document: served, valid, and every documented endpoint's real answers match it.

Each call below goes through the real views; its answer is validated against
the schema the document gives for that path, method and status. A last check
fails if any documented operation was not called, so a new endpoint cannot
go untested against its own documentation.
"""

from __future__ import annotations

import json
import re

import pytest
from jsonschema import Draft202012Validator
from referencing import Registry, Resource
from referencing.jsonschema import DRAFT202012

from gateway.models import ApiKey
from inventory.models import NodeEvent
from inventory.reconcile import reconcile
from tests.opsapi_support import API, Caller, make_token

pytestmark = pytest.mark.django_db


def pointer(*parts: str) -> str:
    return "/".join(part.replace("~", "~0").replace("/", "~1") for part in parts)


class Checked:
    """Calls the API and validates each answer against the document; remembers what it covered."""

    def __init__(self, caller: Caller, document: dict):
        self.caller = caller
        self.document = document
        self.registry = Registry().with_resource("urn:api", Resource.from_contents(document, DRAFT202012))
        self.covered: set[tuple[str, str]] = set()

    def call(self, method: str, path: str, *args, **kwargs):
        response = getattr(self.caller, method)(path, *args, **kwargs)
        route = response.resolver_match.route
        template = "/" + re.sub(r"<(?:\w+:)?(\w+)>", r"{\1}", route)
        operation = self.document["paths"][template][method]
        status = str(response.status_code)
        assert status in operation["responses"], f"{method} {template} answered undocumented {status}"
        content = operation["responses"][status].get("content")
        if content is None:
            assert not response.content, f"{method} {template} {status} has a body it does not document"
        else:
            ref = "urn:api#/" + pointer("paths", template, method, "responses", status, "content", "application/json")
            validator = Draft202012Validator(
                {"$ref": ref + "/schema"}, registry=self.registry, format_checker=Draft202012Validator.FORMAT_CHECKER
            )
            errors = [f"{list(e.absolute_path)}: {e.message}" for e in validator.iter_errors(response.json())]
            assert not errors, f"{method} {template} {status}: {errors[:5]}"
        self.covered.add((template, method))
        return response


@pytest.fixture
def document(client) -> dict:
    response = client.get(f"{API}/schema/", {"format": "json"})
    assert response.status_code == 200
    return json.loads(response.content)


def test_the_document_is_openapi_3_1_with_bearer_tokens(document):
    assert document["openapi"].startswith("3.1")
    assert document["components"]["securitySchemes"]["personalToken"]["scheme"] == "bearer"
    # Every path is under the versioned prefix; the agent API is not part of it.
    assert all(path.startswith(f"{API}/") for path in document["paths"])


def test_every_documented_endpoint_answers_as_documented(client, operator, cluster, document, redis_client):
    _, secret = make_token(operator, scope="operate")
    api = Checked(Caller(client, secret), document)
    NodeEvent.objects.create(node_id="ready-1", kind="registration", reason="registered")

    api.call("get", "/me/")
    api.call("get", "/nodes/")
    api.call("get", "/nodes/", sort="-cpu", state="ready", page_size=1)
    api.call("get", "/nodes/", sort="bogus")
    api.call("get", "/nodes/ready-1/")
    api.call("get", "/nodes/ghost/")
    api.call("get", "/nodes/ready-1/drain/")
    api.call("get", "/nodes/ghost/drain/")
    api.call("post", "/node-actions/", {"action": "drain", "reason": "reboot", "nodes": ["ready-1"]})
    api.call("post", "/node-actions/", {"action": "drain", "nodes": ["ready-1"]})
    api.call("get", "/nodes/ready-1/")  # draining: its drain's progress, not null
    api.call("post", "/deployments/", {"name": "demo", "model_source": "demo", "engine": "demo", "gpus_per_shard": 1})
    api.call("post", "/deployments/", {"name": "demo", "model_source": "demo"})
    api.call("post", "/node-actions/", {"action": "uncordon", "reason": "back", "nodes": ["ready-1"]})
    reconcile()
    api.call("get", "/deployments/")
    api.call("get", "/deployments/demo/")
    api.call("get", "/nodes/ready-1/")
    api.call("get", "/deployments/ghost/")
    api.call("patch", "/deployments/demo/", {"replicas": 2})
    api.call("patch", "/deployments/demo/", {"replicas": -2})
    api.call("get", "/events/")
    api.call("get", "/events/", since=0, limit=1)
    api.call("get", "/events/", since=-1)
    api.call("delete", "/deployments/demo/")
    api.call("post", "/tenants/", {"name": "acme"})
    api.call("post", "/tenants/", {"name": "not one word"})
    api.call("get", "/tenants/")
    api.call("get", "/tenants/acme/")
    api.call("get", "/usage/", tenant="acme", since="24h")
    api.call("get", "/usage/", since="yesterday")
    api.call("get", "/tenants/ghost/")
    api.call("patch", "/tenants/acme/", {"requests_per_second": 5, "concurrent_requests": None})
    api.call("patch", "/tenants/acme/", {"requests_per_second": -5})
    api.call("post", "/keys/", {"tenant": "acme", "name": "billing"})
    api.call("post", "/keys/", {"tenant": "ghost"})
    api.call("get", "/keys/", tenant="acme")
    api.call("delete", f"/keys/{ApiKey.objects.get().pk}/")
    api.call("delete", "/keys/999999/")

    anonymous = Checked(Caller(client, "not-a-token"), document)
    anonymous.call("get", "/nodes/")

    documented = {(path, method) for path, methods in document["paths"].items() for method in methods}
    documented.discard((f"{API}/schema/", "get"))
    assert documented - api.covered == set()


def test_a_read_tokens_refusal_matches_the_document(client, viewer, cluster, document):
    _, secret = make_token(viewer)
    Checked(Caller(client, secret), document).call(
        "post", "/node-actions/", {"action": "cordon", "reason": "x", "nodes": ["ready-1"]}
    )
