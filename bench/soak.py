"""Soak and chaos: the whole stack, a simulated fleet and a few real agents, through restarts and outages.

    python -m bench.soak --minutes 20 --nodes 2000          # make soak
    python -m bench.soak --minutes 2 --nodes 200 --private-postgres \\
        --unreachable-after 10 --lost-after 40              # what tests/test_soak_short.py runs

The stack starts as `make run` starts it (devstack.stack: its own Redis,
granian, Celery worker with beat, Prometheus) on free ports in a temporary
directory, with production settings (DEBUG off, as if behind TLS), on
PostgreSQL. The simulated fleet speaks the real protocol (bench/soaklib/fleet.py);
real agents run beside it, two of them with their clocks ten minutes off. On a
schedule scaled to the run's length, the soak stops Redis for 30 s, restarts
PostgreSQL, kills and restarts the web server, kills and restarts Celery,
silences groups of nodes past the unreachable and the lost thresholds (most
come back), changes inventories, and has an operator cordon, drain and uncordon
through the admin while all this goes on. It samples /metrics throughout.

At the end it checks every item of issue 8 and writes a JSON and a Markdown
report (docs/soak/ by default) plus bench/results/soak.json. Exit status 0 only
when every check passed.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import random
import secrets
import shutil
import signal
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

import psutil
import requests

from bench.soaklib import checks, report
from bench.soaklib.fleet import Fleet
from bench.soaklib.graces import Graces
from bench.soaklib.operator import AdminError, Operator
from bench.soaklib.postgres import PrivatePostgres, SharedPostgres
from devstack.polling import wait_until
from devstack.ports import free_port
from devstack.stack import PYTHON, Part, Stack, default_workers

ROOT = Path(__file__).resolve().parent.parent

PG_RESTART = ["pg_ctlcluster", "--skip-systemctl-redirect", "15", "main", "restart"]
FAULTS = ("redis", "web", "postgres", "celery", "silence", "clock", "operator", "inventory", "replicas")
# A real agent whose wall clock is wrong: time.time() shifted before the agent starts.
# (libfaketime would be the outside way, but it hangs CPython's sleeps.)
SKEWED_AGENT = (
    "import sys, time; skew = float(sys.argv[1]); real = time.time; time.time = lambda: real() + skew; "
    "from agent.__main__ import main; sys.exit(main(sys.argv[2:]))"
)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=20.0, help="length of the measured run (default 20)")
    parser.add_argument("--nodes", type=int, default=2000, help="simulated nodes (default 2000)")
    parser.add_argument("--agents", type=int, default=4, help="real agents; two get clocks 10 minutes off")
    parser.add_argument("--interval", type=float, default=5.0, help="heartbeat interval, seconds")
    parser.add_argument("--unreachable-after", type=float, default=30.0)
    parser.add_argument("--lost-after", type=float, default=300.0)
    parser.add_argument("--beat-period", type=float, default=5.0, help="seconds between stale-marking sweeps")
    parser.add_argument("--redis-outage", type=float, default=30.0, help="seconds Redis stays stopped")
    parser.add_argument(
        "--workers", type=int, default=default_workers(), help="web workers (make run starts cores + 1)"
    )
    parser.add_argument("--faults", default=",".join(FAULTS), help=f"comma-separated subset of {','.join(FAULTS)}")
    parser.add_argument("--database-url", default="postgres://postgres@127.0.0.1:5432/llmgw_soak")
    parser.add_argument("--postgres-restart", default=" ".join(PG_RESTART), help="command restarting PostgreSQL")
    parser.add_argument(
        "--private-postgres", action="store_true", help="start a throw-away PostgreSQL instead (restarts disturb none)"
    )
    parser.add_argument("--out", default=str(ROOT / "docs" / "soak"), help="directory for the JSON and Markdown")
    parser.add_argument(
        "--bench-results", default=str(ROOT / "bench" / "results" / "soak.json"), help="figures file ('' for none)"
    )
    parser.add_argument("--keep", action="store_true", help="keep the temporary directory (logs) afterwards")
    parser.add_argument("--seed", type=int, default=1)
    return parser.parse_args(argv)


class Soak:
    def __init__(self, args: argparse.Namespace):
        self.args = args
        self.faults = set(args.faults.split(",")) - {""}
        self.duration = args.minutes * 60
        self.rng = random.Random(args.seed)
        self.var = Path(tempfile.mkdtemp(prefix="llmgw-soak-"))
        self.timeline: list[dict] = []
        self.outages: list[tuple[float, float]] = []
        self.memory: list[dict] = []
        self.expected_admin: dict[str, set[str]] = {}
        self.silenced: dict[str, float] = {}  # node → when it fell quiet
        self.returned: dict[str, float] = {}  # node → when it spoke again
        self.graces = Graces(args.unreachable_after)
        self.quiet_to_the_end: list = []
        self.operator_errors: list[str] = []
        self.t0 = 0.0

    # -- the stack -------------------------------------------------------------------------------

    def start_stack(self) -> None:
        args = self.args
        if args.private_postgres:
            self.postgres: PrivatePostgres | SharedPostgres = PrivatePostgres().start()
        else:
            self.postgres = SharedPostgres(args.database_url, args.postgres_restart.split()).start()
        self.web_port, self.prometheus_port, redis_port = free_port(), free_port(), free_port()
        self.join_token = secrets.token_urlsafe(32)
        self.env = {
            "DATABASE_URL": self.postgres.url,
            "REDIS_URL": f"redis://127.0.0.1:{redis_port}/0",
            "LLMGW_JOIN_TOKEN": self.join_token,
            "DEBUG": "false",
            "SECRET_KEY": secrets.token_urlsafe(50),
            "ALLOWED_HOSTS": "127.0.0.1,localhost",
            "SECURE_SSL_REDIRECT": "false",
            # Plain HTTP on loopback, as no TLS is in front: tokens may cross it (nodes/entry.py).
            "LLMGW_REQUIRE_HTTPS": "false",
            "LLMGW_HEARTBEAT_INTERVAL": str(args.interval),
            "LLMGW_UNREACHABLE_AFTER": str(args.unreachable_after),
            "LLMGW_LOST_AFTER": str(args.lost_after),
            "LLMGW_BEAT_PERIOD": str(args.beat_period),
            # The whole simulated fleet registers from 127.0.0.1 within one interval.
            "LLMGW_REGISTER_PER_MINUTE": str(max(args.nodes * 4, 100)),
            "LLMGW_VAR_DIR": str(self.var),
        }
        self.stack = Stack(
            self.var, self.env, web_port=self.web_port, prometheus_port=self.prometheus_port, workers=args.workers
        )
        self.stack.start(self.stack.redis_part())
        self.admin_password = self.stack.prepare() or ""
        self.stack.start_web()
        self.stack.start(self.stack.celery_part())
        self.stack.start(self.stack.prometheus_part())
        for i in range(self.args.agents):
            self.stack.start(self.agent_part(i))
        os.environ.update(self.env)
        os.environ.setdefault("DJANGO_SETTINGS_MODULE", "llmgw_site.settings")
        import django

        django.setup()

    def agent_part(self, i: int) -> Part:
        state = self.var / f"agent-{i}"
        state.mkdir(parents=True, exist_ok=True)
        config = state / "agent.yaml"
        config.write_text(
            f"control_plane: http://127.0.0.1:{self.web_port}\n"
            f"node_id: soak-agent-{i}\n"
            f"join_token: {self.join_token}\n"
            f"state_dir: {state}\n"
            f"interval: {self.args.interval:g}\n"
            f"labels:\n  role: soak\n  index: '{i}'\n"
        )
        # Agents 0 and 1 live 10 minutes ahead and behind, when clocks are among the faults.
        skew = {0: 600.0, 1: -600.0}.get(i, 0.0) if "clock" in self.faults else 0.0
        if skew:
            return Part(f"agent-{i}", [PYTHON, "-c", SKEWED_AGENT, str(skew), "--config", str(config)])
        return Part(f"agent-{i}", [PYTHON, "-m", "agent", "--config", str(config)])

    def restart(self, name: str, sig: int, part_factory) -> None:
        self.stack.stop(name, sig)
        self.stack.start(part_factory(), timeout=120)

    # -- faults ----------------------------------------------------------------------------------

    def now(self) -> float:
        return time.time() - self.t0

    def mark(self, event: str, **details) -> None:
        entry = {"t": round(self.now(), 1), "event": event, **details}
        self.timeline.append(entry)
        print(f"[{entry['t']:7.1f} s] {event} {json.dumps(details) if details else ''}", flush=True)

    async def outage(self, name: str, action, affects_heartbeats: bool = True) -> None:
        """Run a blocking fault, recording its window; heartbeats in it do not count as errors."""
        start = time.time()
        self.mark(f"{name}: begins")
        await asyncio.to_thread(action)
        # Clients with requests under way when the part came back still time out or retry:
        # give the window a grace of one request timeout.
        end = time.time() + self.fleet.timeout
        if affects_heartbeats:
            self.outages.append((start, end))
        self.mark(f"{name}: over", seconds=round(end - self.fleet.timeout - start, 1))

    def stop_redis_for(self, seconds: float) -> None:
        self.stack.stop("redis")
        time.sleep(seconds)
        self.stack.start(self.stack.redis_part())
        wait_until(lambda: self.ready(), 60, "/readyz after Redis came back", interval=0.5)

    def ready(self) -> bool:
        try:
            return requests.get(f"http://127.0.0.1:{self.web_port}/readyz", timeout=2).status_code == 200
        except requests.RequestException:
            return False

    @property
    def slack(self) -> float:
        """Silence beyond a threshold that surely crosses it: a beat missed, a sweep, and a margin."""
        return self.args.interval * 2 + self.args.beat_period + 10

    def schedule(self) -> list[tuple[float, str]]:
        """When each fault begins, in seconds after warm-up.

        Silence comes first, and the faults that stop the sweeper (Redis, PostgreSQL,
        Celery) only once the silenced nodes have returned: a node that comes back
        while no sweep can run would never be seen lost, and the soak would be
        testing its own timing. The run is stretched if the faults need longer.
        """
        a, d = self.args, self.duration
        silence_at = 0.03 * d
        returned = silence_at + a.lost_after + self.slack + 5
        plan = [
            (silence_at, "silence"),
            (0.15 * d, "operator"),
            (max(0.25 * d, returned), "redis"),  # an operator acts during it too
            (0.54 * d, "web"),
            (0.62 * d, "postgres"),
            (0.66 * d, "operator"),
            (0.70 * d, "celery"),
            (0.80 * d, "operator"),
        ]
        return sorted((at, fault) for at, fault in plan if fault in self.faults)

    async def run_fault(self, fault: str) -> None:
        if fault == "redis":
            if "operator" in self.faults:
                self.actions.append(asyncio.create_task(asyncio.to_thread(self.operate)))
            await self.outage("Redis stopped", lambda: self.stop_redis_for(self.args.redis_outage))
        elif fault == "web":
            await self.outage(
                "web killed (SIGKILL) and restarted", lambda: self.restart("web", signal.SIGKILL, self.stack.web_part)
            )
        elif fault == "postgres":
            await self.outage("PostgreSQL restarted", self.postgres.restart)
        elif fault == "celery":
            # Heartbeats do not go through Celery; its outage shows in the sweeps instead.
            await self.outage(
                "Celery worker and beat killed (SIGKILL) and restarted",
                lambda: self.restart("celery", signal.SIGKILL, self.stack.celery_part),
                affects_heartbeats=False,
            )
        elif fault == "silence":
            await self.silence()
        elif fault == "operator":
            await asyncio.to_thread(self.operate)

    # -- nodes going quiet -----------------------------------------------------------------------

    async def silence(self) -> None:
        """100 nodes go quiet and come back (half past unreachable, half past lost); 20 stay quiet to the end."""
        a = self.args
        pool = [n for n in self.fleet.nodes if n.skew == 0]
        self.rng.shuffle(pool)
        # Nodes running replicas go quiet first: losing them is what must get the replicas rebuilt.
        hosting = await asyncio.to_thread(nodes_with_allocations)
        pool.sort(key=lambda n: n.node_id not in hosting)
        count = max(min(len(pool) // 20, 50), 2)
        tail = max(count // 5, 1)
        past_lost, stay_lost = pool[:count], pool[count : count + tail]
        rest = pool[count + tail :]
        self.rng.shuffle(rest)
        past_unreachable, stay_unreachable = rest[:count], rest[count : count + tail]
        self.replicas_on_lost = await asyncio.to_thread(replicas_on, [n.node_id for n in past_lost + stay_lost])
        now = time.time()
        for node in past_unreachable + past_lost + stay_lost:
            node.silent = True
            self.silenced[node.node_id] = now
        self.quiet_to_the_end = stay_lost + stay_unreachable
        self.mark(
            "nodes silenced",
            past_unreachable=len(past_unreachable),
            past_lost=len(past_lost),
            quiet_to_the_end=len(stay_lost),
        )
        # The last group falls quiet so that at the end it sits between the two thresholds.
        between = (a.unreachable_after + a.lost_after) / 2

        async def go_quiet_later() -> None:
            # The end moves back when a fault ran long: follow it.
            while time.time() < self.end_at - between:
                await asyncio.sleep(min(self.end_at - between - time.time(), 1))
            for node in stay_unreachable:
                node.silent = True
                self.silenced[node.node_id] = time.time()
            self.mark("nodes silenced until the end", count=len(stay_unreachable), seconds=round(between))

        async def come_back(group, after: float, passing: str) -> None:
            await asyncio.sleep(after)
            for node in group:
                node.silent = False
                self.returned[node.node_id] = time.time()
            self.mark(f"nodes back after passing {passing}", count=len(group), silent_for=round(after))

        self.background += [
            asyncio.create_task(go_quiet_later()),
            asyncio.create_task(come_back(past_unreachable, a.unreachable_after + self.slack, "unreachable")),
            asyncio.create_task(come_back(past_lost, a.lost_after + self.slack, "lost")),
        ]

    def deepest_state(self, since: float, until: float, graces: Graces) -> set[str]:
        """What a node quiet from `since` to `until` must have reached (a set when it could be either).

        A threshold counts as crossed when a sweep was surely free to mark it:
        a beat period and a margin past it, outside the control plane's grace periods.
        """
        a = self.args
        longest = until - since + a.interval  # its last beat may have been up to an interval earlier
        margin = a.beat_period + 5
        if graces.surely_crossed(since, until, a.lost_after, margin):
            return {"lost"}
        could_be_lost = {"lost"} if longest + 1 >= a.lost_after else set()
        if graces.surely_crossed(since, until, a.unreachable_after, margin):
            return {"unreachable"} | could_be_lost
        return {"alive", "unreachable"} | could_be_lost

    # -- operators -------------------------------------------------------------------------------

    def operate(self) -> None:
        """Cordon, drain and uncordon a few nodes through the admin, retrying while the web is down."""
        candidates = [n.node_id for n in self.fleet.nodes if n.node_id not in self.expected_admin]
        self.rng.shuffle(candidates)
        cordon, drain = candidates[:5], candidates[5:8]
        # A silenced node cordoned while quiet must stay cordoned when it returns.
        quiet = [node_id for node_id in self.silenced if node_id not in self.expected_admin][:2]
        cordon += quiet
        cordoned_before = [node_id for node_id, want in self.expected_admin.items() if want == {"cordoned"}]
        uncordon = cordoned_before[:2]
        for action, ids in (("cordon", cordon), ("drain", drain), ("uncordon", uncordon)):
            if not ids:
                continue
            deadline = time.monotonic() + 120
            while True:
                try:
                    self.operator.act(action, ids, f"soak: {action} at {self.now():.0f} s")
                    break
                except (AdminError, requests.RequestException) as exc:
                    if time.monotonic() > deadline:
                        self.operator_errors.append(f"{action} {ids}: {exc}")
                        break
                    time.sleep(2)
            want = {"cordon": {"cordoned"}, "drain": {"draining", "cordoned"}, "uncordon": {"active"}}[action]
            for node_id in ids:
                self.expected_admin[node_id] = want
        self.mark("operator acted", cordon=len(cordon), drain=len(drain), uncordon=len(uncordon))

    # -- sampling --------------------------------------------------------------------------------

    async def watch_graces(self) -> None:
        """Read the sweep's record twice a second, keeping each grace period the control plane gave the fleet."""
        import redis

        from livestate import sweeprecord

        while True:
            try:
                heard = await asyncio.to_thread(sweeprecord.read)
                self.graces.saw(time.time(), heard.record.grace_until)
            except redis.RedisError:
                pass  # Redis stopped: no sweep runs, and its return begins a grace period seen then
            await asyncio.sleep(0.5)

    async def sample_metrics(self) -> None:
        url = f"http://127.0.0.1:{self.web_port}/metrics"
        while True:
            started = time.time()
            try:
                response = await asyncio.to_thread(requests.get, url, timeout=30)
                finished = time.time()
                if response.status_code == 200:
                    await asyncio.to_thread(self.audit.audit, response.text, started, finished, self.fleet.by_id)
                else:
                    self.audit.failed_scrapes += 1
            except requests.RequestException:
                self.audit.failed_scrapes += 1
            await asyncio.sleep(max(15 - (time.time() - started), 1))

    def sample_memory(self, label: str) -> None:
        parts = {}
        for name, part in self.stack.parts.items():
            if part.process is None or part.process.poll() is not None:
                continue
            parts[name] = tree_rss(part.process.pid)
        for pid in self.postgres.processes():
            parts["postgres"] = tree_rss(pid)
        # The soak's own process alone: the stack's processes are its children.
        parts["soak (simulator)"] = round(psutil.Process().memory_info().rss / 2**20, 1)
        self.memory.append({"t": round(self.now(), 1), "label": label, "rss_mib": parts})

    async def sample_memory_every(self, seconds: float) -> None:
        while True:
            await asyncio.sleep(seconds)
            await asyncio.to_thread(self.sample_memory, "during")

    async def change_inventories(self) -> None:
        """Every interval one node in two hundred reports a changed disk, through outages as well."""
        while True:
            await asyncio.sleep(self.args.interval)
            for node in self.rng.sample(self.fleet.nodes, max(len(self.fleet.nodes) // 200, 1)):
                self.fleet.change_inventory(node)

    # -- the run ---------------------------------------------------------------------------------

    async def run(self) -> dict:
        a = self.args
        await asyncio.to_thread(self.start_stack)
        self.fleet = Fleet("127.0.0.1", self.web_port, self.join_token, a.nodes, interval=a.interval, seed=a.seed)
        if "clock" in self.faults:
            # One node in ten lives 10 minutes ahead or behind.
            for node in self.rng.sample(self.fleet.nodes, max(a.nodes // 10, 2)):
                node.skew = self.rng.choice((600.0, -600.0))
        self.operator = Operator(f"http://127.0.0.1:{self.web_port}", "admin", self.admin_password)
        self.audit = checks.MetricsAudit(max_age=float(self.env.get("LLMGW_LOAD_MAX_AGE", 60)))
        self.background: list[asyncio.Task] = []
        self.actions: list[asyncio.Task] = []
        fleet_task = asyncio.create_task(self.fleet.run())
        self.t0 = time.time()
        self.mark("stack up; fleet starting", nodes=a.nodes, agents=a.agents)
        # Warm-up: every node registered, then beating. A whole fleet registering in one
        # burst can starve the first nodes' heartbeats long enough to be marked unreachable
        # (reported as a figure of its own); measuring starts once every node is back.
        self.started_at = time.time()
        deadline = time.time() + max(180, a.nodes / 5)
        while time.time() < deadline and any(n.token is None for n in self.fleet.nodes):
            await asyncio.sleep(1)
        registered = sum(n.token is not None for n in self.fleet.nodes)
        self.mark("fleet registered", registered=registered, seconds=round(time.time() - self.started_at))
        if "replicas" in self.faults:
            # Placed before measuring, so that the nodes silenced first are running replicas.
            wanted = await asyncio.to_thread(create_deployments, a.nodes)
            self.mark("deployments created", replicas_wanted=wanted)
        await asyncio.sleep(a.unreachable_after + 2 * a.beat_period)
        while time.time() < deadline and not await asyncio.to_thread(all_alive):
            await asyncio.sleep(1)
        while "replicas" in self.faults and time.time() < deadline and not await asyncio.to_thread(all_placed):
            await asyncio.sleep(1)
        self.t0 = time.time()
        self.end_at = self.t0 + self.duration
        self.mark("warm-up over; measuring", registered=registered)
        await asyncio.to_thread(self.sample_memory, "start")
        self.background += [
            asyncio.create_task(self.sample_metrics()),
            asyncio.create_task(self.sample_memory_every(60)),
            asyncio.create_task(self.watch_graces()),
        ]
        if "inventory" in self.faults:
            self.background.append(asyncio.create_task(self.change_inventories()))
        settle = 2 * a.interval + a.beat_period + 5
        for at, fault in self.schedule():
            # A fault that ran long pushes the next one back: never two at once.
            await asyncio.sleep(max(self.t0 + at - time.time(), 0))
            await self.run_fault(fault)
            await asyncio.sleep(3)
        # Every part back, then long enough for every returned node to beat and be swept.
        self.end_at = max(self.end_at, time.time() + settle)
        await asyncio.sleep(max(self.end_at - time.time(), 0))
        await asyncio.gather(*self.actions)
        for task in self.background:
            task.cancel()
        self.mark("run over; checking")
        await asyncio.to_thread(self.sample_memory, "end")
        self.fleet.stop()
        await fleet_task
        self.stopped_at = time.time()
        return await asyncio.to_thread(self.check)

    def check(self) -> dict:
        from django.db import close_old_connections

        close_old_connections()
        a = self.args
        sim_ids = {n.node_id for n in self.fleet.nodes}
        expected_liveness = {node_id: {"alive"} for node_id in sim_ids}
        required = {}  # node → states it must have passed through on the way (one of them)
        excused = []  # nodes that a grace period let off a state they would have had to reach
        for node_id, since in self.silenced.items():
            back = self.returned.get(node_id)
            deepest = self.deepest_state(since, back or self.stopped_at, self.graces)
            if back is None:
                expected_liveness[node_id] = deepest
            if "alive" not in deepest:
                required[node_id] = deepest
            if deepest != self.deepest_state(since, back or self.stopped_at, Graces(a.unreachable_after)):
                excused.append(node_id)
        for i in range(a.agents):
            expected_liveness[f"soak-agent-{i}"] = {"alive"}
        expected_admin = {node_id: {"active"} for node_id in expected_liveness}
        expected_admin.update(self.expected_admin)
        never_silent = sorted(sim_ids - set(self.silenced))
        results = {
            "inventory": checks.inventory_check(self.fleet.nodes),
            "states": checks.state_check(expected_liveness, expected_admin),
            "transitions": checks.transitions_check(required, never_silent, self.t0, excused),
            "allocations": allocation_check(getattr(self, "replicas_on_lost", set())),
            "metrics": self.audit.summary(),
            "heartbeats": checks.heartbeat_summary(
                self.fleet.requests, self.outages, self.t0, self.stopped_at, a.nodes / a.interval
            ),
            "operator": {"errors": self.operator_errors, "ok": not self.operator_errors},
            "clock_skew": skew_check(self.fleet.nodes, a.agents if "clock" in self.faults else 0),
            "memory": memory_summary(self.memory),
        }
        return {
            "date": datetime.now(UTC).isoformat(timespec="seconds"),
            "machine": machine(),
            "settings": {
                "minutes": a.minutes,
                "nodes": a.nodes,
                "agents": a.agents,
                "interval_s": a.interval,
                "unreachable_after_s": a.unreachable_after,
                "lost_after_s": a.lost_after,
                "redis_outage_s": a.redis_outage,
                "web_workers": a.workers,
                "database": "private PostgreSQL" if a.private_postgres else a.database_url,
                "faults": sorted(self.faults),
            },
            "warm_up": warmup_summary(self.started_at, self.t0),
            "timeline": self.timeline,
            "outage_windows_s": [[round(s - self.t0, 1), round(e - self.t0, 1)] for s, e in self.outages],
            "grace_periods": self.graces.summary(self.t0),
            "checks": results,
            "memory_samples": self.memory,
            "ok": all(check.get("ok", True) for check in results.values()),
        }

    def stop(self) -> None:
        if hasattr(self, "stack"):
            self.stack.stop_all()
        if hasattr(self, "postgres"):
            self.postgres.stop()
        if not self.args.keep:
            shutil.rmtree(self.var, ignore_errors=True)
        else:
            print(f"logs kept in {self.var / 'log'}")


def create_deployments(nodes: int) -> int:
    """Two deployments as an operator would make them: one single-GPU model, one two-node replica."""
    from inventory.models import Deployment

    small = Deployment.objects.create(
        name="llama-8b",
        model_source="meta-llama/Meta-Llama-3-8B-Instruct",
        engine="vllm",
        replicas=max(nodes // 20, 2),
        gpus_per_shard=1,
        memory_gb_per_shard=32,
    )
    large = Deployment.objects.create(
        name="llama-70b",
        model_source="meta-llama/Meta-Llama-3-70B-Instruct",
        engine="vllm",
        replicas=max(nodes // 200, 1),
        shards_per_replica=2,
        gpus_per_shard=4,
        memory_gb_per_shard=160,
    )
    return small.replicas + large.replicas


def all_placed() -> bool:
    from django.db.models import Sum

    from inventory.models import Deployment, Replica
    from inventory.models.deployments import RUN_STATES

    wanted = Deployment.objects.aggregate(n=Sum("replicas"))["n"] or 0
    return Replica.objects.filter(state__in=RUN_STATES).count() >= wanted


def nodes_with_allocations() -> set[str]:
    from inventory.models import Allocation

    return set(Allocation.objects.values_list("node_id", flat=True).distinct())


def replicas_on(node_ids: list[str]) -> set[str]:
    from inventory.models import Allocation

    return set(Allocation.objects.filter(node_id__in=node_ids).values_list("replica_id", flat=True))


def allocation_check(replicas_on_lost: set[str]) -> dict:
    """No GPU claimed twice; nothing left on a lost node; every replica a lost node had was rebuilt elsewhere."""
    from django.db.models import Count, Sum

    from inventory.models import Allocation, Deployment, GPUClaim, Liveness, Replica, Shard
    from inventory.models.deployments import RUN_STATES

    doubled = list(
        GPUClaim.objects.values("node_id", "gpu_index")
        .annotate(n=Count("id"))
        .filter(n__gt=1)
        .values_list("node_id", "gpu_index")[:10]
    )
    on_lost = list(Allocation.objects.filter(node__liveness=Liveness.LOST).values_list("shard_id", flat=True)[:10])
    shards_on_lost = Shard.objects.filter(state__in=RUN_STATES, node__liveness=Liveness.LOST).count()
    wanted = Deployment.objects.aggregate(n=Sum("replicas"))["n"] or 0
    placed = Replica.objects.filter(state__in=RUN_STATES).count()
    still_live = sorted(
        Replica.objects.filter(replica_id__in=replicas_on_lost, state__in=RUN_STATES).values_list(
            "replica_id", flat=True
        )
    )
    rebuilt = Replica.objects.filter(replaces__replica_id__in=replicas_on_lost).count()
    return {
        "allocations": Allocation.objects.count(),
        "gpus_claimed_twice": doubled,
        "allocations_on_lost_nodes": on_lost,
        "live_shards_on_lost_nodes": shards_on_lost,
        "replicas_wanted": wanted,
        "replicas_placed_at_end": placed,
        "replicas_on_nodes_that_were_lost": len(replicas_on_lost),
        "of_those_still_live": still_live[:10],
        # Replicas recorded as replacing one of them (the reconciler may instead just make new ones).
        "replacements_for_them": rebuilt,
        "ok": not doubled and not on_lost and not shards_on_lost and placed == wanted and not still_live,
    }


def all_alive() -> bool:
    from django.db import close_old_connections

    from inventory.models import Node

    close_old_connections()
    return not Node.objects.exclude(liveness="alive").exists()


def warmup_summary(started_at: float, t0: float) -> dict:
    """Nodes the registration burst got marked unreachable before measuring began (not a failure)."""
    from datetime import UTC, datetime

    from inventory.models import NodeEvent

    window = (datetime.fromtimestamp(started_at, UTC), datetime.fromtimestamp(t0, UTC))
    marked = NodeEvent.objects.filter(kind=NodeEvent.Kind.LIVENESS, to_state="unreachable", at__range=window)
    return {"seconds": round(t0 - started_at, 1), "marked_unreachable": marked.values("node_id").distinct().count()}


def skew_check(nodes, skewed_agents: int) -> dict:
    """Nodes whose clocks are 10 minutes off are alive and never marked otherwise (ages use our clock)."""
    from inventory.models import Node, NodeEvent

    ids = [n.node_id for n in nodes if n.skew] + [f"soak-agent-{i}" for i in range(min(skewed_agents, 2))]
    alive = Node.objects.filter(pk__in=ids, liveness="alive").count()
    changed = NodeEvent.objects.filter(node_id__in=ids, kind=NodeEvent.Kind.LIVENESS).values("node_id").distinct()
    return {
        "nodes": len(ids),
        "alive_at_end": alive,
        # Outages can mark any node unreachable; the figure is reported, the check is the end state.
        "ever_marked_unreachable": changed.count(),
        "ok": alive == len(ids),
    }


def tree_rss(pid: int) -> float:
    try:
        process = psutil.Process(pid)
        members = [process, *process.children(recursive=True)]
    except psutil.Error:
        return 0.0
    total = 0
    for member in members:
        with contextlib.suppress(psutil.Error):
            total += member.memory_info().rss
    return round(total / 2**20, 1)


def memory_summary(samples: list[dict]) -> dict:
    start = next((s for s in samples if s["label"] == "start"), None)
    end = next((s for s in reversed(samples) if s["label"] == "end"), None)
    if start is None or end is None:
        return {"ok": False, "reason": "no start or end sample"}
    rows = {}
    for name in sorted(set(start["rss_mib"]) | set(end["rss_mib"])):
        rows[name] = {"start_mib": start["rss_mib"].get(name), "end_mib": end["rss_mib"].get(name)}
    return {"processes": rows, "ok": True}


def machine() -> dict:
    return {
        "host": platform.node(),
        "cpus": os.cpu_count(),
        "memory_gib": round(psutil.virtual_memory().total / 2**30, 1),
        "python": platform.python_version(),
        "load_average_at_end": [round(x, 2) for x in os.getloadavg()],
    }


def stop_on_sigterm(signum, frame):
    raise SystemExit(128 + signum)  # unwinds through the finally that stops the stack


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, stop_on_sigterm)
    soak = Soak(args)
    try:
        result = asyncio.run(soak.run())
    finally:
        soak.stop()
    paths = report.write(result, Path(args.out), Path(args.bench_results) if args.bench_results else None)
    print(report.markdown(result))
    print("written: " + ", ".join(str(p) for p in paths))
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
