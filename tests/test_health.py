import pytest


def test_healthz_answers_without_database(client):
    response = client.get("/healthz")
    assert response.status_code == 200
    assert response.json() == {"status": "ok"}


@pytest.mark.django_db
def test_readyz_reports_database_and_redis_reachable(client, redis_client):
    response = client.get("/readyz")
    assert response.status_code == 200, response.json()


@pytest.mark.django_db
def test_readyz_names_redis_when_it_is_down(client, settings):
    from nodes import loadstore
    from tests.services import free_port

    settings.REDIS_URL = f"redis://127.0.0.1:{free_port()}/0"
    loadstore.reset_client()
    try:
        response = client.get("/readyz")
    finally:
        loadstore.reset_client()
    assert response.status_code == 503
    assert "redis" in response.json()["problems"]
    assert "database" not in response.json()["problems"]
