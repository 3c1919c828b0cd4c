import pytest

from devstack.faults import redis_unreachable


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
    with redis_unreachable(settings):
        response = client.get("/readyz")
    assert response.status_code == 503
    assert "redis" in response.json()["problems"]
    assert "database" not in response.json()["problems"]
