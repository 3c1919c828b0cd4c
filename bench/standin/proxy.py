"""The HAProxy configurations the benchmarks compare, and HAProxy run on one of them.

Two kinds of config are rendered here:

- `routing_config`: one backend of replicas balanced by one policy (round-robin,
  least outstanding requests, least with the queue held at the proxy, prefix affinity
  with bounded load), for bench/routing.py;
- `gateway_config`: the gateway as issue 23 measured it (keys as SHA-256 digests in a
  map, the backend chosen from the body's `model` through a map, leastconn, retries,
  `option http-no-delay`), for bench/gateway.py. It is written out inline below until
  the gateway's own template, deploy/gateway.cfg, lands; then `gateway_config` should
  fill that template instead, and nothing else in the benchmark needs to change.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from devstack.polling import wait_until
from devstack.ports import free_port, port_open
from devstack.proxy import ask, haproxy_binary

# Long enough that a request queued behind an overloaded replica is measured, not cut.
SLOW_TIMEOUT = "300s"
ROUTING_POLICIES = ("roundrobin", "leastconn", "leastconn-queue", "affinity")
# The part of a request the affinity policy hashes: the body's leading bytes, which hold the
# model and the start of the first message, where a shared system prompt or a conversation
# begins. Bytes need no JSON parsing, and clients write `model` and `messages` first.
AFFINITY_KEY = "req.body,bytes(0,320)"
# Bounded load: no replica takes more than 1.25 times the average of outstanding requests.
BALANCE_FACTOR = 125


# A whole request body must fit to be routed on its model: 256 KiB routed a 200 KB body (issue 23).
GATEWAY_BUFSIZE = 262144


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
        "affinity": f"balance hash {AFFINITY_KEY}\n    hash-type consistent\n    hash-balance-factor {BALANCE_FACTOR}",
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


def key_digest(api_key: str) -> str:
    """The form an API key is kept in: what HAProxy's `sha2(256),hex,lower` makes of the bearer token."""
    return hashlib.sha256(api_key.encode()).hexdigest()


# ---- Inline until deploy/gateway.cfg lands (see the module's docstring). -----------------------------
def gateway_config(
    port: int,
    models: dict[str, list[Server]],
    stats_socket: Path,
    maps: Path,
    replica_secret: str | None = None,
    nbthread: int = 1,
    maxconn: int = 8192,
    bufsize: int | None = None,
) -> str:
    """The gateway: a key checked by its digest, the backend chosen by the body's model, leastconn, retries.

    `maps` is a folder holding keys.map (one digest per line, then the tenant) and
    models.map (a served model name, then its backend), written by `write_maps`.
    """
    backends = []
    for model, servers in models.items():
        lines = "\n".join(f"    server {s.name} 127.0.0.1:{s.port} pool-max-conn -1" for s in servers)
        secret = f'    http-request set-header Authorization "Bearer {replica_secret}"\n' if replica_secret else ""
        backends.append(
            f"""backend model_{model}
    balance leastconn
    http-reuse always
{secret}{lines}
"""
        )
    not_found = openai_error("the model does not exist", "model", "model_not_found")
    bad_key = openai_error("invalid api key", None, "invalid_api_key")
    key_known = f"{{ var(txn.key),map({maps}/keys.map) -m found }}"
    routed = "{ var(txn.backend) -m found }"
    return (
        _global(stats_socket, nbthread, maxconn, bufsize or GATEWAY_BUFSIZE)
        + f"""
defaults
    mode http
    option http-no-delay
    timeout connect 2s
    timeout client {SLOW_TIMEOUT}
    timeout server {SLOW_TIMEOUT}
    timeout queue 30s
    timeout http-request 10s
    retries 3
    retry-on conn-failure empty-response 503
    option redispatch 1

frontend gateway
    bind 127.0.0.1:{port}
    option http-buffer-request
    http-request set-var(txn.key) req.fhdr(authorization),regsub("^Bearer ",""),sha2(256),hex,lower
    http-request return status 401 content-type application/json string '{bad_key}' unless {key_known}
    http-request set-var(txn.backend) req.body,json_query('$.model'),map({maps}/models.map)
    http-request return status 404 content-type application/json string '{not_found}' unless {routed}
    use_backend %[var(txn.backend)]

"""
        + "\n".join(backends)
    )


def openai_error(message: str, param: str | None, code: str) -> str:
    error = {"message": message, "type": "invalid_request_error", "param": param, "code": code}
    return json.dumps({"error": error}, separators=(",", ":"))


def write_maps(maps: Path, api_keys: dict[str, str], models: list[str]) -> None:
    """keys.map from tenant → key (only digests are written), models.map naming each model's backend."""
    maps.mkdir(parents=True, exist_ok=True)
    (maps / "keys.map").write_text("".join(f"{key_digest(key)} {tenant}\n" for tenant, key in api_keys.items()))
    (maps / "models.map").write_text("".join(f"{model} model_{model}\n" for model in models))


# ---- End of the inline gateway config. ---------------------------------------------------------------


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
