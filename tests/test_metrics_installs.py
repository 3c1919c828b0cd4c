"""/metrics exports each engine install the agents report, its state as a label; a changed state ends the old series."""

from __future__ import annotations

import pytest

from agent import protocol
from inventory.registration import upsert_inventory
from tests.factories import make_inventory
from tests.metrics_scrape import TEXT, body, named, samples

pytestmark = pytest.mark.django_db


def scrape(client) -> dict:
    response = client.get("/metrics", headers={"Accept": TEXT})
    assert response.status_code == 200
    return samples(body(response))


def report(*installs: protocol.EngineInstall) -> None:
    upsert_inventory("cpu-1", make_inventory("cpu-1.example", provision=list(installs)))


def llama(state: protocol.InstallState, detail: str = "") -> protocol.EngineInstall:
    return protocol.EngineInstall(engine="llama.cpp", version="0.3.36", variant="cpu", state=state, detail=detail)


def installs(found: dict) -> dict[tuple, float]:
    return {
        tuple(dict(labels)[k] for k in ("node", "engine", "version", "variant", "state")): value
        for labels, value in named(found, "llmgw_engine_install_state").items()
    }


def test_each_reported_install_is_one_series_with_its_state(client, redis_client):
    report(llama("installing", "building llama-server: 42 %"))
    assert installs(scrape(client)) == {("cpu-1", "llama.cpp", "0.3.36", "cpu", "installing"): 1.0}
    cuda = protocol.EngineInstall(engine="vllm", version="0.11.0", variant="cuda", state="unsupported", detail="no GPU")
    report(llama("failed", 'make: *** Error 2 "quoted"\nsecond line'), cuda)
    assert installs(scrape(client)) == {
        ("cpu-1", "llama.cpp", "0.3.36", "cpu", "failed"): 1.0,
        ("cpu-1", "vllm", "0.11.0", "cuda", "unsupported"): 1.0,
    }
    report()
    assert installs(scrape(client)) == {}
