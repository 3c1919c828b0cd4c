"""The gateway's control loop: what should be (the inventory) against what HAProxy has, repaired.

Each pass reads the desired state (`gateway.wanted`), asks HAProxy what it actually has over
its Runtime API, and makes the difference: servers added, moved, weighted, drained, taken
out and deleted; keys and models added to and deleted from the maps. Every file is rewritten
as it changes, so an HAProxy restarted with them serves the last known state. A new or
removed deployment (a backend) or a changed engine secret needs a new config: rendered,
then reloaded through the master. When the database cannot be read the last desired state
stands; when HAProxy cannot be reached, the next pass tries again. Nothing is assumed from
an earlier pass: HAProxy may have restarted in between.

Two things go the other way each pass: the servers' weights follow their engines' queues
(`gateway.weights`), and the requests in flight on each server are reported (to Redis, by
`gateway_sync`), so that a leaving replica's engine is stopped only once they have ended
(`inventory.drainhold`). A server no longer wanted with requests on it is drained, not
deleted, until they have.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from gateway import counted, fairness, haproxy_config, weights
from gateway.haproxy_config import Backend, Desired, Frontend, Paths, ServerState
from gateway.metrics import GatewayMetrics
from gateway.runtime import ActualServer, Runtime, RuntimeError_

log = logging.getLogger("llmgw.gateway")

# How long a reload may take before the pass gives up and the next one looks again.
RELOAD_DEADLINE = 10.0


@dataclass
class Pass:
    """What one pass did: the commands it sent (for the log and the tests), and what it could not do."""

    actions: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    # What HAProxy refused for now and a later pass will try again (a server still holding requests).
    waiting: list[str] = field(default_factory=list)
    reloaded: bool = False


class Sync:
    def __init__(
        self,
        paths: Paths,
        frontend: Frontend,
        read_desired: Callable[[], Desired],
        *,
        record_usage: Callable[[dict[counted.Key, counted.Counted]], None],
        report_in_flight: Callable[[dict[str, int]], None] | None = None,
        read_queues: Callable[[Desired], dict[str, float]] | None = None,
    ):
        self.paths = paths
        self.frontend = frontend
        self.read_desired = read_desired
        # Where the requests in flight on each server go, by replica id: what a drain waits for.
        self.report_in_flight = report_in_flight
        # Each server's engine queue depth by name, which weighs it (gateway.weights); None: all weigh the same.
        self.read_queues = read_queues
        self.record_usage = record_usage
        # Tokens taken from HAProxy and not yet written (the database was down): written next pass.
        self.unrecorded: dict[counted.Key, counted.Counted] = {}
        self.metrics = GatewayMetrics()
        self.runtime = Runtime(paths.admin_socket, paths.master_socket)
        self.desired: Desired | None = None
        # The tenants' recent demand on each model, which their fair shares come from (gateway.fairness).
        self.recent = fairness.Recent()
        # The shape the running HAProxy was last reloaded with; None: not known (a new sync process).
        self.loaded_shape: tuple | None = None

    def run_once(self) -> Pass:
        done = Pass()
        # Usage first: the budgets read next see this pass's tokens.
        self._collect_usage(done)
        try:
            self.desired = self.read_desired()
        except Exception as exc:  # the database down, or any read error: keep serving what was known
            done.errors.append(f"desired state not read, keeping the last: {exc}")
            log.warning("gateway: %s", done.errors[-1])
        if self.desired is None:
            return done
        desired = self._with_fair_shares(self.desired)
        self.metrics.over_budget.set(len(desired.budget_spent))
        config_changed = haproxy_config.write_all(self.paths, self.frontend, desired)
        try:
            if self._needs_reload(desired, config_changed):
                self._reload(desired, done)
            elif self.loaded_shape is None:
                self.loaded_shape = desired.shape()
            actual = self.runtime.servers()
            in_flight = self.runtime.in_flight()
            limits = self.runtime.server_limits()
            # Weights change with the engines' queues: set at run time, never written to the config.
            running = self._weighted(desired, done)
            for backend in running.backends.values():
                self._repair_servers(backend, actual.get(backend.name, {}), in_flight, limits, done)
            self._report(in_flight, done)
            self._repair_map(self.paths.models_map, desired.models_map(), done)
            self._repair_map(self.paths.running_usage_map, desired.running_usage_map(), done)
            self._repair_map(self.paths.keys_map, desired.keys, done)
            self._repair_map(self.paths.catalog_map, desired.catalog_map(), done)
            self._repair_map(self.paths.rps_map, desired.requests_per_second, done)
            self._repair_map(self.paths.concurrency_map, desired.concurrent_requests, done)
            self._repair_map(self.paths.budget_map, desired.budget_spent, done)
            self._repair_map(self.paths.fair_map, desired.fair_shares, done)
            self._publish_in_flight(done)
        except RuntimeError_ as exc:
            done.errors.append(str(exc))
            log.warning("gateway: %s", exc)
        for action in done.actions:
            log.info("gateway: %s", action)
        return done

    def _collect_usage(self, done: Pass) -> None:
        try:
            taken = counted.take(self.runtime)
            self.metrics.taken(taken.usage)
            self.metrics.first_tokens.add(taken.first_tokens)
            for key, amounts in taken.usage.items():
                self.unrecorded.setdefault(key, counted.Counted()).add(amounts)
        except RuntimeError_ as exc:
            done.errors.append(f"usage not taken: {exc}")
            log.warning("gateway: %s", done.errors[-1])
        if self.unrecorded:
            try:
                self.record_usage(self.unrecorded)
                self.unrecorded = {}
            except Exception as exc:  # the database down: kept for the next pass
                done.errors.append(f"usage not recorded, kept for the next pass: {exc}")
                log.warning("gateway: %s", done.errors[-1])
        self.metrics.unrecorded.set(sum(c.requests for c in self.unrecorded.values()))

    # -- backends: only a reload changes them ---------------------------------------------------

    def _needs_reload(self, desired: Desired, config_changed: bool) -> bool:
        wanted = {b.name for b in desired.backends.values()}
        running = {name for name in self.runtime.backends() if name.startswith("m_")}
        if running != wanted:
            return True
        if self.loaded_shape is None:
            # Secrets cannot be read back from HAProxy: a new sync process that found the config
            # on disk already as it renders it trusts the running HAProxy to have loaded it.
            return config_changed
        return self.loaded_shape != desired.shape()

    def _reload(self, desired: Desired, done: Pass) -> None:
        old_worker = self.runtime.worker_pid()
        self.runtime.reload()
        wanted = {b.name for b in desired.backends.values()}
        deadline = time.monotonic() + RELOAD_DEADLINE
        while time.monotonic() < deadline:
            try:
                # The new worker, on the new config, answers the admin socket (a secret's change leaves
                # the backends' names as they were: the worker's pid tells the new one).
                new = self.runtime.worker_pid() != old_worker
                if new and {n for n in self.runtime.backends() if n.startswith("m_")} == wanted:
                    break
            except RuntimeError_:
                pass  # the new worker's socket is not bound yet
            time.sleep(0.05)
        else:
            raise RuntimeError_("the reload did not bring the new backends within the deadline")
        self.loaded_shape = desired.shape()
        done.reloaded = True
        done.actions.append(f"reloaded with backends {sorted(wanted)}")

    # -- servers --------------------------------------------------------------------------------

    def _repair_servers(
        self,
        backend: Backend,
        actual: dict[str, ActualServer],
        in_flight: dict[tuple[str, str], int],
        limits: dict[tuple[str, str], int],
        done: Pass,
    ) -> None:
        wanted = {s.name: s for s in backend.servers}
        for name, server in wanted.items():
            where = f"{backend.name}/{name}"
            have = actual.get(name)
            maxconn = limits.get((backend.name, name), 0)
            if have is None:
                self._do(
                    done,
                    f"add server {where} {server.address}:{server.port} {haproxy_config.server_options(server)}",
                    ok=("New server registered",),
                )
                have = ActualServer(name, server.address, server.port, server.weight, 0x01)
                maxconn = server.maxconn
            if maxconn != server.maxconn:
                self._do(done, f"set maxconn server {where} {server.maxconn}")
            if (have.address, have.port) != (server.address, server.port):
                self._do(
                    done, f"set server {where} addr {server.address} port {server.port}", ok=("IP changed", "no need")
                )
            if have.weight != server.weight:
                self._do(done, f"set server {where} weight {server.weight}")
            if have.state != server.state:
                self._do(done, f"set server {where} state {server.state}")
        for name, have in actual.items():
            if name in wanted:
                continue
            where = f"{backend.name}/{name}"
            if in_flight.get((backend.name, name), 0):
                # No new request reaches it; those in flight finish, and it goes once they have.
                if have.state != ServerState.DRAIN:
                    self._do(done, f"set server {where} state drain")
                continue
            if have.state != "maint":
                self._do(done, f"set server {where} state maint")
            # Refused while a connection is still open on it: the next pass tries again.
            answer = self.runtime.ask(f"del server {where}").strip()
            if answer.startswith("Server deleted"):
                done.actions.append(f"del server {where}")
            else:
                done.waiting.append(f"del server {where}: {answer}")

    def _with_fair_shares(self, desired: Desired) -> Desired:
        """`desired` with each saturable model's fair share, from the tenants' requests on it now (gateway.fairness)."""
        if not any(s.maxconn for b in desired.backends.values() for s in b.servers):
            return desired  # no model limited: nothing to ask HAProxy
        try:
            asked = self.recent.add(fairness.demands(self.runtime.ask(fairness.command())))
        except RuntimeError_:  # HAProxy not there: the shares as if nobody asked (the repairs below say why)
            asked = {}
        return dataclasses.replace(desired, fair_shares=fairness.shares(desired, asked))

    def _weighted(self, desired: Desired, done: Pass) -> Desired:
        if self.read_queues is None:
            return desired
        try:
            return weights.weighted(desired, self.read_queues(desired))
        except Exception as exc:  # weights are an optimisation: a failure must not stop the repairs
            done.errors.append(f"engines' queues not read, every server weighs the same: {exc}")
            return desired

    def _report(self, in_flight: dict[tuple[str, str], int], done: Pass) -> None:
        if self.report_in_flight is None:
            return
        by_replica: dict[str, int] = {}
        for (backend, server), count in in_flight.items():
            if backend.startswith("m_"):
                by_replica[server] = by_replica.get(server, 0) + count
        try:
            self.report_in_flight(by_replica)
        except Exception as exc:  # Redis down: drains stop waiting (bounded by their deadline anyway)
            done.errors.append(f"requests in flight not reported: {exc}")

    # -- tenants' requests in flight, for the other gateways -----------------------------------

    def _publish_in_flight(self, done: Pass) -> None:
        """With peers: each tenant's requests in flight here (conn_cur, which peers do not send) into gpt0,
        which they do. A request admitted writes it as it starts; this writes it again once requests have
        ended, and rewrites it while they last, before the others' copies of the entry expire."""
        if self.frontend.peering is None:
            return
        table = self.frontend.peering.table
        entries = self.runtime.table_entries(table, "data.gpt0 gt 0")
        entries.update(self.runtime.table_entries(table, "data.conn_cur gt 0"))
        for tenant, counters in sorted(entries.items()):
            in_flight = counters.get("conn_cur", 0)
            stale = counters.get("gpt0", 0) != in_flight
            expiring = in_flight > 0 and counters.get("exp", 0) < haproxy_config.TENANTS_EXPIRE_S * 1000 / 2
            if stale or expiring:
                self._do(done, f"set table {table} key {tenant} data.gpt0 {in_flight}")

    # -- maps -----------------------------------------------------------------------------------

    def _repair_map(self, path, wanted: dict[str, str], done: Pass) -> None:
        actual = self.runtime.map_entries(path)
        for key, value in wanted.items():
            if key not in actual:
                self._do(done, f"add map {path} {key} {value}", shown=f"add map {path.name} {key[:12]}")
            elif actual[key] != value:
                self._do(done, f"set map {path} {key} {value}", shown=f"set map {path.name} {key[:12]}")
        for key in actual.keys() - wanted.keys():
            self._do(done, f"del map {path} {key}", shown=f"del map {path.name} {key[:12]}")

    def _do(self, done: Pass, command: str, ok: tuple[str, ...] = ("",), shown: str = "") -> None:
        self.runtime.command(command, ok=ok)
        done.actions.append(shown or command)


def loop(sync: Sync, interval: float = 1.0, stop: Callable[[], bool] = lambda: False) -> None:
    """A pass every `interval` seconds, each from a fresh look at both sides, until `stop()`."""
    while not stop():
        started = time.monotonic()
        sync.run_once()
        time.sleep(max(0.0, interval - (time.monotonic() - started)))


__all__ = ["Pass", "ServerState", "Sync", "loop"]
