"""The agent's schedule: sampling on its own clock, heartbeats beside it, discovery now and then.

Three threads share little: the sampler (the caller's thread) polls the runner and
publishes the newest load in one slot; the beater sends whatever is newest, backing
off with full jitter while the control plane is away; the discoverer refreshes the
inventory. Because there is one slot and no queue, an outage of any length costs
no memory: when the control plane returns it gets the latest load only.
"""

from __future__ import annotations

import itertools
import logging
import random
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import msgspec
import requests

from agent import admission, cgroups, leftovers, protocol
from agent import config as agent_config
from agent.client import ControlPlane, Rejected, TokenStore, Unauthorized, Unavailable
from agent.discovery import Discoverer, inventory_hash
from agent.discovery.gpus import GPUSampler
from agent.load import Sampler
from agent.procfs import REAL, Roots
from agent.provision import Provisioner, Want
from agent.runner import Runner

log = logging.getLogger("agent")


@dataclass(frozen=True)
class Tuning:
    """Timings with production defaults; tests shrink them instead of waiting."""

    backoff_base: float = 1.0
    backoff_cap: float = 30.0
    connect_timeout: float = 3.05
    read_timeout: float = 10.0
    rediscover_every: float = 60.0
    grace: float = 10.0
    # The runner is polled at least this often, so a crashed engine restarts promptly
    # even when heartbeats are minutes apart.
    tick: float = 1.0
    # While beats keep failing, say so at most this often.
    quiet_for: float = 60.0
    # A failed engine install is tried again after this, doubling up to the cap.
    install_backoff_base: float = 60.0
    install_backoff_cap: float = 3600.0


class Agent:
    def __init__(
        self,
        config: agent_config.Config,
        roots: Roots = REAL,
        tuning: Tuning | None = None,
        session: requests.Session | None = None,
    ):
        self.config = config
        self.tuning = tuning = tuning or Tuning()
        self.interval = config.interval
        self.state_dir = Path(config.state_dir)
        self.sampler = Sampler(roots.proc)
        self.gpus = GPUSampler()
        self.discoverer = Discoverer(config, roots)
        self.cgroups = None if config.cgroup_root == "none" else cgroups.Cgroups.find(roots, config.cgroup_root)
        self.runner = Runner(
            self.state_dir / "logs",
            env=config.env,
            grace=tuning.grace,
            record_file=self.state_dir / "groups.json",
            cgroups=self.cgroups,
            key_dir=self.state_dir / "keys",
        )
        self.client = ControlPlane(
            config.control_plane, tuning.connect_timeout, tuning.read_timeout, session, ca_file=config.ca_file
        )
        self.tokens = TokenStore(self.state_dir)
        self.provisioner = Provisioner(
            self.state_dir / "engines",
            cache=Path(config.engine_cache) if config.engine_cache else None,
            env=config.env,
            # Only engines the operator named are taken as installed; the default probes are guesses.
            operator_binaries=config.engine_commands if config.engines is not None else {},
            gpus=lambda: len(self.discovered[0].gpus),
            backoff_base=tuning.install_backoff_base,
            backoff_cap=tuning.install_backoff_cap,
        )
        self.configured_shards = agent_config.shard_specs(config)
        self.allowed = admission.Allowed(tuple(config.model_dirs), tuple(config.command_programs))
        # Shards of the last reply the agent would not run, and why: reported as failed with each beat.
        self.refused: dict[str, str] = {}

        self.started = False
        self.stopping = threading.Event()
        self.changed = threading.Condition()
        self.latest: protocol.Load | None = None
        self.samples = 0
        # One attribute, swapped whole, so a reader never pairs one inventory with another's hash.
        self.discovered: tuple[protocol.Inventory, str] = (protocol.Inventory(), "")
        self.acknowledged_hash = ""
        # (discovered, provision, result) of with_provision's last
        self._provisioned: (
            tuple[tuple[protocol.Inventory, str], list[protocol.EngineInstall], tuple[protocol.Inventory, str]] | None
        ) = None
        self.inventory_wanted = False
        self.token: str | None = None
        # This run's name and its heartbeats' numbers (docs/protocol.md): the control plane
        # refuses a heartbeat no newer than one it has from the same run, so a delayed or
        # replayed one cannot put back an older state. Random per start, since a new run
        # must never be mistaken for an old one, whatever the clock did in between.
        self.boot_id = uuid.uuid4().hex
        self._numbers = itertools.count(1)
        self.beats_failed = 0  # in a row
        self.beats_rejected = 0  # in a row
        self._last_complaint = float("-inf")

    # -- start and stop -------------------------------------------------------------------------

    def start_up(self, run_shards: bool = True) -> None:
        """Discover (strictly: a missing adapter raises), start the configured shards, take the first reading."""
        if self.started:
            return
        self.started = True
        try:
            self.state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        except OSError as exc:
            raise agent_config.ConfigError(f"state_dir: cannot create {self.state_dir}: {exc.strerror}") from None
        self._set_inventory(self.discoverer.discover(strict=True))
        if run_shards and self.runner.record_file is not None:
            leftovers.reap(self.runner.record_file, self.tuning.grace)
            if self.cgroups is not None:
                self.cgroups.prepare()
            self.runner.reconcile(self.configured_shards)
        self.sampler.sample(self.runner.process_groups(), self.runner.placements())

    def run(self) -> int:
        """Start up if not yet done, run until stop(); then stop every engine group and return 0."""
        self.start_up()
        threads = [
            threading.Thread(target=self._beat_loop, name="beat", daemon=True),
            threading.Thread(target=self._discover_loop, name="discover", daemon=True),
        ]
        for thread in threads:
            thread.start()
        try:
            self._sample_loop()
        finally:
            self.stop()
            self.provisioner.stop()
            log.info("stopping: sending SIGTERM to every engine group")
            self.runner.stop_all()
            self.gpus.close()
            for thread in threads:
                thread.join(self.tuning.read_timeout + self.tuning.connect_timeout + 1)
        return 0

    def stop(self) -> None:
        self.stopping.set()
        with self.changed:
            self.changed.notify_all()

    # -- sampling ------------------------------------------------------------------------------

    def sample_now(self) -> protocol.Load | None:
        self.runner.poll()
        load = self.sampler.sample(self.runner.process_groups(), self.runner.placements())
        # Sampled even without a load (the first reading), so no XID goes unseen.
        gpus = self.gpus.sample()
        if load is not None:
            load.gpus = gpus
        with self.changed:
            # A failed reading replaces the last good one: sending that again would present old load as new.
            self.latest = load
            self.samples += 1
            self.changed.notify_all()
        return load

    def _sample_loop(self) -> None:
        due = time.monotonic() + self.interval
        while not self.stopping.is_set():
            now = time.monotonic()
            try:
                if now >= due:
                    self.sample_now()
                else:
                    self.runner.poll()
            except Exception:
                # Whatever /proc or a child did, the agent goes on: a node that stops reporting looks dead.
                log.exception("sampling failed; trying again at the next interval")
            if now >= due:
                # Keep to the schedule, but never try to catch up on missed samples.
                due = max(due + self.interval, now)
            self.stopping.wait(min(self.tuning.tick, max(due - time.monotonic(), 0)))

    # -- discovery -----------------------------------------------------------------------------

    def _discover_loop(self) -> None:
        while not self.stopping.wait(self.tuning.rediscover_every):
            try:
                self._set_inventory(self.discoverer.discover(self.sampler.own_pids))
            except Exception:
                # Discovery reads a changing machine; a surprise must not end the thread that notices changes.
                log.exception("discovery failed; keeping the previous inventory")

    def _set_inventory(self, inventory: protocol.Inventory) -> None:
        digest = inventory_hash(inventory)
        if self.discovered[1] and digest != self.discovered[1]:
            log.info("inventory changed; it goes with the next heartbeat")
        self.discovered = (inventory, digest)

    # -- heartbeats ----------------------------------------------------------------------------

    def heartbeat_message(self, load: protocol.Load | None, with_inventory: bool | None = None) -> protocol.Heartbeat:
        inventory, digest = self.with_provision()
        if with_inventory is None:
            with_inventory = digest != self.acknowledged_hash or self.inventory_wanted
        return protocol.Heartbeat(
            inventory_hash=digest,
            inventory=inventory if with_inventory else None,
            load=load,
            shards=self.shard_statuses(),
            sent_at=time.time(),
            boot_id=self.boot_id,
            seq=next(self._numbers),
        )

    def shard_statuses(self) -> list[protocol.ShardStatus]:
        """What the runner runs, and each shard of the reply refused, as failed with the reason."""
        statuses = self.runner.statuses()
        running = {status.shard for status in statuses}
        refused = [
            protocol.ShardStatus(shard=shard, state="failed", detail=reason[: protocol.MAX_DETAIL])
            for shard, reason in sorted(self.refused.items())
            if shard not in running
        ]
        return [*statuses, *refused][: protocol.MAX_SHARDS]

    def with_provision(self) -> tuple[protocol.Inventory, str]:
        """The discovered inventory with the installs as they stand now, and its hash.

        Installs move between discoveries; a changed entry changes the hash, so it goes with the next
        beat. The hash is computed again only when the installs or the discovered inventory changed."""
        discovered = self.discovered
        provision = self.provisioner.entries()
        if not provision:
            return discovered
        last = self._provisioned
        if last is not None and last[0] is discovered and last[1] == provision:
            return last[2]
        inventory = msgspec.structs.replace(discovered[0], provision=provision)
        result = (inventory, inventory_hash(inventory))
        self._provisioned = (discovered, provision, result)
        return result

    def beat_once(self) -> protocol.HeartbeatReply:
        """Register if need be, send the newest load, apply the reply. Raises Unavailable, Rejected."""
        if self.token is None:
            self.token = self.tokens.load(self.config.node_id) or self._register()
        message = self.heartbeat_message(self.latest)
        try:
            reply = self.client.heartbeat(self.token, message)
        except Unauthorized as exc:
            # The control plane forgot us or the token was revoked: register once, then retry once.
            log.warning("heartbeat refused (%s); registering again", exc)
            self.tokens.forget()
            self.token = None
            self.token = self._register()
            message = self.heartbeat_message(self.latest)
            try:
                reply = self.client.heartbeat(self.token, message)
            except Unauthorized as again:
                self.token = None
                raise Unavailable(f"new token refused too: {again}") from None
        if message.inventory is not None:
            self.acknowledged_hash = message.inventory_hash
        if message.load is not None:
            self.gpus.acknowledge(message.load.gpus)
        self._apply(reply)
        return reply

    def _register(self) -> str:
        try:
            join_token = self.config.read_join_token()
        except agent_config.ConfigError as exc:
            raise Unavailable(str(exc)) from None
        inventory, digest = self.discovered
        try:
            registered = self.client.register(
                join_token, protocol.Register(node_id=self.config.node_id, inventory=inventory, inventory_hash=digest)
            )
        except Unauthorized as exc:
            raise Unavailable(f"join token refused: {exc}") from None
        self.tokens.save(self.config.node_id, registered.token)
        self.acknowledged_hash = digest
        self._set_interval(registered.heartbeat_interval)
        log.info("registered as %s", self.config.node_id)
        return registered.token

    def _apply(self, reply: protocol.HeartbeatReply) -> None:
        self.inventory_wanted = reply.inventory_wanted
        self._set_interval(reply.heartbeat_interval)
        if reply.engines is not None:
            self.provisioner.want([Want(e.engine, e.version, e.variant) for e in reply.engines])
        # None: the control plane does not manage shards, so the config's run; a list: exactly those.
        if reply.shards is None:
            self.refused = {}
            self.runner.reconcile(self.configured_shards)
        else:
            self.runner.reconcile(self._runnable(reply.shards))

    def _runnable(self, specs: list[protocol.ShardSpec]) -> list[protocol.ShardSpec]:
        """Specs the agent may run (agent/admission.py) and can report on; the others are refused.

        A refused shard with a valid id is reported failed with the reason; one without cannot be
        named in a heartbeat (it would make every later one invalid), so it is only logged."""
        runnable = []
        refused: dict[str, str] = {}
        for spec in specs[: protocol.MAX_SHARDS]:
            if not agent_config.valid_id(spec.shard):
                self._complain("ignoring shard %r from the control plane: not a valid shard id", spec.shard[:200])
                continue
            reason = admission.shard_refusal(spec, self.allowed)
            if reason is not None:
                if spec.shard not in self.refused:
                    log.warning("shard %s from the control plane %s", spec.shard, reason)
                refused[spec.shard] = reason
                continue
            if self.provisioner.wanted(spec.engine):
                installed = self.provisioner.ready(spec.engine)
                if installed is None:
                    # Started now it would fail for want of its binary, and restart in a loop until the build ends.
                    continue
                spec = with_engine_on_path(spec, installed, self.runner.env)
            runnable.append(spec)
        self.refused = refused
        return runnable

    def _set_interval(self, seconds: float) -> None:
        if 0 < seconds <= 3600 and seconds != self.interval:
            log.info("heartbeat interval is now %g s", seconds)
            self.interval = seconds

    def _beat_loop(self) -> None:
        self._seen = 0
        retry = False
        while not self.stopping.is_set():
            if not retry:
                with self.changed:
                    self.changed.wait_for(lambda: self.samples > self._seen or self.stopping.is_set())
                    self._seen = self.samples
                if self.stopping.is_set():
                    return
            try:
                self.beat_once()
            except Rejected as exc:
                self.beats_rejected += 1
                self._complain("control plane rejected the heartbeat: %s", exc, first=self.beats_rejected == 1)
            except Exception as exc:
                # Unavailable, or a surprise (a full disk while saving the token): either way the
                # thread must live on and try again, or the node would go silent while it runs.
                if not isinstance(exc, Unavailable):
                    log.exception("heartbeat failed unexpectedly")
                self._failed(exc)
                retry = True
                self.stopping.wait(self._backoff())
                continue
            else:
                self.beats_rejected = 0
                if self.beats_failed:
                    log.info("control plane answers again after %d failed heartbeats", self.beats_failed)
                self.beats_failed = 0
            retry = False

    def _failed(self, exc: Exception) -> None:
        self.beats_failed += 1
        self._complain("heartbeat failed (%d in a row): %s", self.beats_failed, exc, first=self.beats_failed == 1)

    def _complain(self, message: str, *args: object, first: bool = False) -> None:
        now = time.monotonic()
        if first or now - self._last_complaint >= self.tuning.quiet_for:
            self._last_complaint = now
            log.warning(message, *args)

    def _backoff(self) -> float:
        """Full jitter: uniform up to an exponentially growing ceiling, so a fleet does not return in step."""
        ceiling = min(self.tuning.backoff_cap, self.tuning.backoff_base * 2 ** min(self.beats_failed - 1, 30))
        return random.uniform(0, ceiling)


def with_engine_on_path(spec: protocol.ShardSpec, bin_dir: Path, env: dict[str, str]) -> protocol.ShardSpec:
    """The spec with the installed engine first on its PATH: the control plane's commands name programs, not paths."""
    path = spec.env.get("PATH") or env.get("PATH", "/usr/bin:/bin")
    return msgspec.structs.replace(spec, env={**spec.env, "PATH": f"{bin_dir}:{path}"})
