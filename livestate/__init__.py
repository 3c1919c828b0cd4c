"""Everything the control plane keeps in Redis, and the one way to reach it.

A plain package below the domain: it may read `django.conf.settings` and use
Django's transaction hooks, but it imports no models and nothing of
`inventory` or `nodes` (the layers contract in pyproject.toml holds this).
Each module owns one kind of state; `livestate.keys` names every key.
"""

from __future__ import annotations

import redis
from django.conf import settings
from redis.backoff import NoBackoff
from redis.retry import Retry

_clients: dict[bool, redis.Redis] = {}


def client(*, fail_fast: bool = False) -> redis.Redis:
    """This process's shared client, made on first use from REDIS_URL.

    Timeouts are short, since a dead Redis must not hang a request. `fail_fast`
    gives the rate limiter's client, which never retries: redis-py's default
    retries for seconds with backoff, and a limiter that waits that long on every
    request during an outage is worse than none.
    """
    found = _clients.get(fail_fast)
    if found is None:
        if fail_fast:
            found = redis.Redis.from_url(
                settings.REDIS_URL, socket_timeout=0.5, socket_connect_timeout=0.5, retry=Retry(NoBackoff(), 0)
            )
        else:
            found = redis.Redis.from_url(
                settings.REDIS_URL, socket_timeout=1, socket_connect_timeout=1, health_check_interval=30
            )
        _clients[fail_fast] = found
    return found


def reset_client() -> None:
    """Forget the clients, so the next use reads REDIS_URL again (tests point it elsewhere).

    The beat script's own connection follows: it is remade when `client()` changes.
    """
    _clients.clear()
