"""The gateway as production runs it, in front of stand-in engines: for bench/gateway.py and bench/routing.py.

Its config is deploy/gateway.cfg rendered by `gateway.haproxy_config` (keys map, model routing,
the 400/404/413 rules, retries, the engine secret header), HAProxy is started as devstack starts
it (master-worker, glibc's allocator fixed), and its servers are programmed by the gateway's own
sync (`gateway.sync.Sync`), here from a `Desired` built for the stand-in engines instead of read
from the inventory: what is measured is what production runs, less the database.
"""

from __future__ import annotations

import os
import subprocess
import tempfile
import threading
from dataclasses import dataclass, field
from pathlib import Path

from bench.standin.proxy import Server as StandinServer
from devstack import gateway as devgateway
from devstack.polling import wait_until
from devstack.ports import free_port, port_open
from gateway import haproxy_config
from gateway.haproxy_config import Backend, Desired, Frontend, Paths, Server, key_digest
from gateway.runtime import Runtime, RuntimeError_, ask
from gateway.sync import Sync, loop


def desired(
    models: dict[str, list[StandinServer]],
    engine_secret: str,
    keys: dict[str, str],
    affinity: bool = False,
    max_in_flight: int = 0,
    running_usage: str = "",
) -> Desired:
    """One backend per model, a server per stand-in replica; `keys` tenant → key, kept as digests.
    `max_in_flight`: the deployments' max in flight per replica (each server's maxconn), 0 for none;
    `running_usage`: what the relay adds to a stream for a running usage (an engine kind's record's)."""
    backends = {
        model: Backend(
            model,
            engine_secret,
            tuple(Server(f"{model}-{s.name}", "127.0.0.1", s.port, maxconn=max_in_flight) for s in servers),
            prefix_affinity=affinity,
            running_usage=running_usage,
        )
        for model, servers in models.items()
    }
    return Desired(backends=backends, keys={key_digest(key): tenant for tenant, key in keys.items()})


@dataclass
class RealGateway:
    """HAProxy on the gateway's rendered config, programmed by one pass of its sync; stopped on leaving the `with`."""

    wanted: Desired
    max_body: int = haproxy_config.MAX_BODY
    # Streams through the relay (deploy/gateway_relay.lua), as production runs; False to measure what it costs.
    relay: bool = True
    env: dict[str, str] = field(default_factory=lambda: dict(devgateway.HAPROXY_ENV))
    port: int = 0
    process: subprocess.Popen | None = None
    # The worker's: the process that carries the requests (the master only watches it).
    pid: int = 0
    # Seconds between the sync's passes while the gateway runs, as gateway_sync does (fair shares follow
    # the tenants' requests); 0: the one pass that programs it.
    sync_every: float = 0.0

    def __post_init__(self) -> None:
        self.port = free_port()
        self.paths = Paths(Path(tempfile.mkdtemp(prefix="bench-gateway-")))
        self.frontend = Frontend(f"127.0.0.1:{self.port}", self.max_body, relay=self.relay)
        self.runtime = Runtime(self.paths.admin_socket, self.paths.master_socket)
        # The benchmark keeps no usage: what HAProxy counted is taken and dropped.
        self.sync = Sync(self.paths, self.frontend, lambda: self.wanted, record_usage=lambda counted: None)
        self.stopping = threading.Event()
        self.syncing: threading.Thread | None = None

    def __enter__(self) -> RealGateway:
        # As a new gateway starts: an empty config first, then the sync brings the backends and servers.
        haproxy_config.write_all(self.paths, self.frontend, Desired())
        process = self.process = subprocess.Popen(
            devgateway.haproxy_command(self.paths.directory),
            env={**os.environ, **self.env},
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        try:
            wait_until(lambda: process.poll() is not None or self.listening(), 10, "the gateway to listen")
            if process.poll() is not None:
                raise RuntimeError(f"haproxy exited: {process.communicate()[1].decode()}")
            done = self.sync.run_once()
            if done.errors:
                raise RuntimeError(f"the gateway's sync failed: {done.errors}")
            # Measured from the worker the reload started, once the old one has gone.
            wait_until(lambda: "# old workers" not in self.processes(), 10, "the old HAProxy worker to leave")
            self.pid = self.runtime.worker_pid()
            if self.sync_every:
                self.syncing = threading.Thread(
                    target=loop, args=(self.sync, self.sync_every, self.stopping.is_set), daemon=True
                )
                self.syncing.start()
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.stopping.set()
        if self.syncing:
            self.syncing.join(10)
        if self.process and self.process.poll() is None:
            self.process.terminate()
            self.process.wait(10)

    def listening(self) -> bool:
        """The port, the worker's admin socket and the master's (which the sync reloads through) all answer."""
        if not (port_open(self.port) and self.paths.admin_socket.exists()):
            return False
        try:
            ask(self.paths.master_socket, "show proc")
        except RuntimeError_:
            return False
        return True

    def processes(self) -> str:
        try:
            return ask(self.paths.master_socket, "show proc")
        except RuntimeError_:
            return "# old workers: unknown while the master starts"

    def ask(self, command: str) -> str:
        return self.runtime.ask(command)
