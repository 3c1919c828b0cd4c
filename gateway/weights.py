"""Servers weighted by their engines' queues: what each replica reports, read by the sync every pass.

HAProxy balances by least outstanding requests (`balance leastconn`), but it counts only its own:
requests from the other gateways, and those an engine has queued for want of a free slot, it does
not see. Each pass asks every ready server's engine for its queue depth (the engine's own
/metrics, under the names `agent.enginekinds` records map for llama.cpp, vLLM and SGLang, with the
deployment's secret, which llama-server keeps /metrics behind), and halves the server's weight
for each request waiting there, so leastconn sends a queueing replica half, a quarter, ... of its
share. Queue depths are whole numbers, so the weight changes only when the queue does; an
engine that does not answer within the deadline keeps the full weight (its health is the
control plane's to judge, not the weights').
"""

from __future__ import annotations

import dataclasses
import http.client
import urllib.request
from concurrent.futures import ThreadPoolExecutor

from agent.enginekinds import Signal
from agent.enginekinds.rules import sources
from gateway.haproxy_config import DEFAULT_WEIGHT, Desired, Server, ServerState

# Each engine's answer is awaited this long, all of them at once: the pass runs every second.
TIMEOUT = 0.3
PARALLEL = 32
WAITING_METRICS = tuple(source.metric for source in sources(Signal.REQUESTS_WAITING))


def weight(waiting: float) -> int:
    """The full weight halved for each request waiting in the engine's queue; never below 1."""
    return max(1, DEFAULT_WEIGHT >> min(int(waiting), 16))


def queue_depth(metrics: str) -> float | None:
    """Requests waiting, summed over the engine's series of any name mapped for it; None if it exports none."""
    total, found = 0.0, False
    for line in metrics.splitlines():
        name = line.split("{", 1)[0].split(" ", 1)[0]
        if name in WAITING_METRICS:
            total += float(line.rsplit(" ", 1)[-1])
            found = True
    return total if found else None


def scrape(server: Server, secret: str) -> float | None:
    request = urllib.request.Request(
        f"http://{server.address}:{server.port}/metrics", headers={"Authorization": f"Bearer {secret}"}
    )
    try:
        with urllib.request.urlopen(request, timeout=TIMEOUT) as answer:
            return queue_depth(answer.read().decode(errors="replace"))
    except (OSError, ValueError, http.client.HTTPException):  # no answer, or not one we can read
        return None


def queues(desired: Desired) -> dict[str, float]:
    """Each ready server's queue depth by server name, asked of every engine at once."""
    asked = [
        (server, backend.engine_secret)
        for backend in desired.backends.values()
        for server in backend.servers
        if server.state == ServerState.READY
    ]
    if not asked:
        return {}
    with ThreadPoolExecutor(max_workers=min(PARALLEL, len(asked))) as pool:
        depths = pool.map(lambda pair: scrape(*pair), asked)
        return {server.name: depth for (server, _), depth in zip(asked, depths, strict=True) if depth is not None}


def weighted(desired: Desired, depths: dict[str, float]) -> Desired:
    """`desired` with each server's weight from its engine's queue depth (unknown: the full weight)."""
    backends = {
        served: dataclasses.replace(
            backend,
            servers=tuple(
                dataclasses.replace(s, weight=weight(depths[s.name])) if s.name in depths else s
                for s in backend.servers
            ),
        )
        for served, backend in desired.backends.items()
    }
    return dataclasses.replace(desired, backends=backends)
