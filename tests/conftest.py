"""The fixed cast every test can use: users, a small cluster, and a real Redis."""

from __future__ import annotations

import os

import pytest
from django.conf import settings
from django.utils import timezone

import livestate
from devstack.redis_server import RedisServer
from inventory.models import AdminState, Liveness
from inventory.registration import upsert_inventory
from livestate import shardlists
from tests.factories import make_inventory, set_state


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory):
    """A real Redis: the one at LLMGW_TEST_REDIS_URL, or one started for this run."""
    given = os.environ.get("LLMGW_TEST_REDIS_URL")
    if given:
        yield given
        return
    server = RedisServer(tmp_path_factory.mktemp("redis")).start()
    yield server
    server.stop()


@pytest.fixture(autouse=True, scope="session")
def _redis_everywhere(redis_server):
    """Point every part of the control plane at the test Redis, never the machine's own."""
    url = redis_server if isinstance(redis_server, str) else redis_server.url
    settings.REDIS_URL = url
    settings.CELERY_BROKER_URL = url
    livestate.reset_client()
    yield url


@pytest.fixture(autouse=True)
def _no_cached_shards():
    """Each test's nodes are new: no shard list cached by an earlier test may answer for them."""
    shardlists.forget()


@pytest.fixture(autouse=True, scope="session")
def _agent_api_limits_out_of_the_way():
    """Tests register many nodes from 127.0.0.1 and beat fast; the limits' own tests lower them again."""
    settings.LLMGW_REGISTER_PER_MINUTE = 1_000_000
    settings.LLMGW_HEARTBEAT_PER_MINUTE = 1_000_000
    settings.LLMGW_AUTH_FAILURES_PER_MINUTE = 1_000_000


@pytest.fixture(autouse=True, scope="session")
def _no_refill_threads():
    """A heartbeat finding Redis emptied refills it in a thread that would outlive its test; tests/test_refill.py
    turns it on again."""
    settings.LLMGW_REFILL_AFTER_LOSS = False


@pytest.fixture
def redis_client(_redis_everywhere):
    client = livestate.client()
    client.flushdb()
    yield client
    client.flushdb()


@pytest.fixture
def operator(django_user_model):
    return django_user_model.objects.create_user("operator", password="operator-pass", is_staff=True, is_superuser=True)


@pytest.fixture
def viewer(django_user_model):
    return django_user_model.objects.create_user("viewer", password="viewer-pass")


@pytest.fixture
def cluster(db):
    """Four nodes with GPUs, one in each interesting state."""
    now = timezone.now()
    nodes = {}
    for name, admin_state, liveness in (
        ("ready-1", AdminState.ACTIVE, Liveness.ALIVE),
        ("cordoned-1", AdminState.CORDONED, Liveness.ALIVE),
        ("unreachable-1", AdminState.ACTIVE, Liveness.UNREACHABLE),
        ("lost-1", AdminState.ACTIVE, Liveness.LOST),
    ):
        node, _ = upsert_inventory(name, make_inventory(f"{name}.example", gpus=8), now=now)
        set_state(name, admin_state, liveness, now)
        node.refresh_from_db()
        nodes[name] = node
    return nodes


# The gateway's tests (tests/test_gateway*.py) share these two: a real HAProxy programmed by a real sync,
# in the test's own directory, and a key for tenant acme.
@pytest.fixture
def gateway(tmp_path):
    from tests.test_gateway import Gateway  # a test module's helper: imported only where a test asks for it

    made = Gateway(tmp_path / "gw")
    yield made
    made.stop()


@pytest.fixture
def key(db) -> str:
    from gateway.models import ApiKey, Tenant

    made = ApiKey(tenant=Tenant.objects.create(name="acme"))
    secret = made.issue()
    made.save()
    return secret
