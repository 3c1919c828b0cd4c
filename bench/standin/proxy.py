"""The HAProxy configurations bench/routing.py compares, and HAProxy run on one of them.

`routing_config`: one backend of replicas balanced by one policy (round-robin, least
outstanding requests, least with the queue held at the proxy, prefix affinity with bounded
load). bench/gateway.py measures the gateway's own config instead (real_gateway.py).
"""

from __future__ import annotations

import os
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from devstack.polling import wait_until
from devstack.ports import free_port, port_open
from devstack.proxy import ask, haproxy_binary
from gateway.haproxy_config import PREFIX_AFFINITY

# Long enough that a request queued behind an overloaded replica is measured, not cut.
SLOW_TIMEOUT = "300s"
ROUTING_POLICIES = ("roundrobin", "leastconn", "leastconn-queue", "affinity")


@dataclass(frozen=True)
class Server:
    name: str
    port: int
    slots: int = 4


def _global(stats_socket: Path, nbthread: int, maxconn: int, bufsize: int) -> str:
    return f"""global
    nbthread {nbthread}
    maxconn {maxconn}
    tune.bufsize {bufsize}
    stats socket {stats_socket} mode 600 level admin
"""


def routing_config(policy: str, servers: list[Server], port: int, stats_socket: Path) -> str:
    """One frontend, one backend of `servers` balanced by `policy` (one of ROUTING_POLICIES)."""
    balance = {
        "roundrobin": "balance roundrobin",
        "leastconn": "balance leastconn",
        "leastconn-queue": "balance leastconn",
        # The gateway's own prefix affinity with bounded load (gateway/haproxy_config.py), as deployments set it.
        "affinity": "\n".join(PREFIX_AFFINITY).strip(),
    }[policy]
    # leastconn-queue: each replica gets no more requests than it has slots; the rest wait in
    # HAProxy's one queue and go to whichever replica frees a slot first.
    queue_at_proxy = policy == "leastconn-queue"
    lines = "\n".join(
        f"    server {s.name} 127.0.0.1:{s.port} weight 100" + (f" maxconn {s.slots}" if queue_at_proxy else "")
        for s in servers
    )
    return (
        _global(stats_socket, 1, 8192, 65536)
        + f"""
defaults
    mode http
    option http-no-delay
    timeout connect 2s
    timeout client {SLOW_TIMEOUT}
    timeout server {SLOW_TIMEOUT}
    timeout queue {SLOW_TIMEOUT}
    timeout http-request 10s

frontend routing
    bind 127.0.0.1:{port}
    default_backend replicas

backend replicas
    option http-buffer-request
    http-reuse always
    {balance}
{lines}
"""
    )


class HAProxy:
    """`haproxy -db` on a rendered config, in a temporary folder; stopped on leaving the `with`."""

    def __init__(self, render, workdir: Path | None = None, env: dict[str, str] | None = None):
        self.env = {**os.environ, **env} if env else None
        self.workdir = workdir or Path(tempfile.mkdtemp(prefix="bench-haproxy-"))
        self.port = free_port()
        self.stats_socket = self.workdir / "haproxy.sock"
        self.config = self.workdir / "haproxy.cfg"
        self.config.write_text(render(self.port, self.stats_socket))
        self.process: subprocess.Popen | None = None

    def __enter__(self) -> HAProxy:
        self.process = process = subprocess.Popen(
            [haproxy_binary(), "-db", "-f", str(self.config)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            env=self.env,
        )
        try:
            wait_until(lambda: process.poll() is not None or port_open(self.port), 10, "HAProxy to listen")
        except TimeoutError:
            self.__exit__()
            raise
        if process.poll() is not None:
            _, errors = process.communicate()
            raise RuntimeError(f"haproxy exited: {errors.decode()}")
        return self

    def __exit__(self, *exc) -> None:
        if self.process and self.process.poll() is None:
            self.process.terminate()
            self.process.wait(10)

    @property
    def pid(self) -> int:
        if self.process is None:
            raise RuntimeError("HAProxy is started by entering its `with`")
        return self.process.pid

    def ask(self, command: str) -> str:
        return ask(self.stats_socket, command)
