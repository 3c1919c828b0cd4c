"""Where a heartbeat's CPU goes in one web process: cProfile over the WSGI application, beside the empty view.

    python -m bench.fleetlib.profile [--nodes 200] [--beats 4000] [--top 25] [--cold [flushed|partition|registered]]
                                     [--pairs 9] [--database-url postgres://…]

The application is called in this process, as a web worker calls it, with
heartbeats of the benchmark's fleet (bench/fleetlib/bodies.py) against a Redis
of its own and SQLite; CPU per request (process time) is measured without the
profiler for heartbeats and for the empty view, then the heartbeats are run
again under cProfile. The socket and HTTP parsing, which the web server does for
both alike, are left out; so is the machine's load, since process time is this
process's own.

With `--cold`, every heartbeat is its node's first since Redis lost its data
(FLUSHDB before each pass over the fleet, outside the measured time): its card,
sequence and shard list are gone, as after a Redis restart without its data,
That path is measured and profiled beside the ordinary one. `--cold partition`
instead has the sweep's flush revive the fleet, then marks every node
unreachable in bulk as the sweep does, before each pass (a fleet coming back
after a partition); `--cold registered` registers every node again (a new
token each) before each pass (a fleet's first heartbeats after registering).
Their heartbeats are cold only where those changes leave the cards stale.
Then `--pairs` ordinary and cold passes over the fleet run in turn, and the
median of each pair's ratio is printed: on a shared machine whose load changes
during the run, a ratio of two figures measured minutes apart says little.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import os
import pstats
import random
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from devstack.redis_server import RedisServer

JOIN_TOKEN = "profile-join-token"
EMPTY = "/api/v1/bench-empty"
HEARTBEAT = "/api/v1/heartbeat"


def environ(path: str, token: str | None, body: bytes, method: str = "POST", **meta) -> dict:
    """A request's WSGI environ as a web server hands it to the application; `meta` adds or replaces entries."""
    built = {
        "REQUEST_METHOD": method,
        "PATH_INFO": path,
        "SCRIPT_NAME": "",
        "QUERY_STRING": "",
        "SERVER_NAME": "127.0.0.1",
        "SERVER_PORT": "8000",
        "SERVER_PROTOCOL": "HTTP/1.1",
        "HTTP_HOST": "127.0.0.1:8000",
        "CONTENT_TYPE": "application/json",
        "CONTENT_LENGTH": str(len(body)),
        "REMOTE_ADDR": "127.0.0.1",
        "wsgi.input": io.BytesIO(body),
        "wsgi.errors": sys.stderr,
        "wsgi.url_scheme": "http",
        "wsgi.version": (1, 0),
        "wsgi.multithread": False,
        "wsgi.multiprocess": True,
        "wsgi.run_once": False,
    }
    if token is not None:
        built["HTTP_AUTHORIZATION"] = f"Bearer {token}"
    return built | meta


class Started:
    """A WSGI server's `start_response`, keeping the status and headers each answer started with."""

    def __init__(self) -> None:
        self.answers: list[tuple[str, list[tuple[str, str]]]] = []

    def __call__(
        self, status: str, headers: list[tuple[str, str]], exc_info: object = None
    ) -> Callable[[bytes], object]:
        self.answers.append((status, headers))
        return self.write

    @staticmethod
    def write(data: bytes) -> None:
        raise NotImplementedError("the application wrote through start_response's callable, which WSGI deprecates")


def call(application, path: str, token: str, body: bytes) -> str:
    started = Started()
    result = application(environ(path, token, body), started)
    try:
        for _ in result:
            pass
    finally:
        if hasattr(result, "close"):
            result.close()
    return started.answers[0][0]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=200)
    parser.add_argument("--beats", type=int, default=4000)
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument(
        "--cold",
        nargs="?",
        const="flushed",
        choices=["flushed", "partition", "registered"],
        help="profile each node's first heartbeat after Redis lost its data (flushed), after a partition, "
        "or after registering",
    )
    parser.add_argument(
        "--pairs", type=int, default=9, help="with --cold: ordinary and cold passes over the fleet measured in turn"
    )
    parser.add_argument("--database-url", help="a database to use instead of a new SQLite file (e.g. PostgreSQL's)")
    args = parser.parse_args()

    var = Path(tempfile.mkdtemp(prefix="llmgw-profile-"))
    redis = RedisServer(var / "redis").start()
    os.environ.update(
        DJANGO_SETTINGS_MODULE="llmgw_site.settings",
        DEBUG="true",
        LLMGW_VAR_DIR=str(var),
        DATABASE_URL=args.database_url or f"sqlite:///{var / 'db.sqlite3'}",
        REDIS_URL=redis.url,
        LLMGW_JOIN_TOKEN=JOIN_TOKEN,
        LLMGW_BENCH_EMPTY_VIEW="true",
        LLMGW_REGISTER_PER_MINUTE="100000",
        LLMGW_HEARTBEAT_PER_MINUTE="100000",
    )
    try:
        import django

        django.setup()
        from django.core.management import call_command

        from agent import protocol
        from bench.fleetlib import bodies

        call_command("migrate", verbosity=0)
        from llmgw_site.wsgi import application

        def register(message: protocol.Register) -> str:
            result = application(environ("/api/v1/register", JOIN_TOKEN, protocol.encode(message)), Started())
            return protocol.decode(b"".join(result), protocol.Registered).token

        fleet, messages = [], []
        for index in range(args.nodes):
            rng = random.Random(index)
            message, digest = bodies.registration(index, rng)
            messages.append(message)
            inv = message.inventory
            body = bodies.heartbeat(index, digest, inv.host.cpus, inv.memory_total_bytes, rng)
            fleet.append((register(message), body))

        def make_cold() -> None:
            """Before a pass over the fleet: what leaves its nodes' next heartbeats on the cold path, if anything."""
            if args.cold == "flushed":
                livestate.client().flushdb()
            elif args.cold == "partition":
                now = timezone.now()
                liveness.flush(now)  # the last pass's heartbeats revive the nodes marked before it
                node_ids = [message.node_id for message in messages]
                liveness.change_in_bulk(node_ids, Liveness.ALIVE, Liveness.UNREACHABLE, "profiled partition", now)
            else:
                for index, message in enumerate(messages):
                    fleet[index] = (register(message), fleet[index][1])

        def drive(path: str, beats: int) -> float:
            started = time.process_time()
            for n in range(beats):
                token, body = fleet[n % len(fleet)]
                status = call(application, path, token, body)
                if not status.startswith("200"):
                    raise RuntimeError(f"{path}: {status}")
            return 1e6 * (time.process_time() - started) / beats

        def drive_cold(beats: int, profiler: cProfile.Profile | None = None) -> float:
            """`drive` with `make_cold` before each pass over the fleet, outside the measured time."""
            spent = 0.0
            for start in range(0, beats, len(fleet)):
                make_cold()
                if profiler:
                    profiler.enable()
                started = time.process_time()
                for token, body in fleet[: beats - start]:
                    status = call(application, HEARTBEAT, token, body)
                    if not status.startswith("200"):
                        raise RuntimeError(f"{HEARTBEAT} (cold): {status}")
                spent += time.process_time() - started
                if profiler:
                    profiler.disable()
            return 1e6 * spent / beats

        from django.utils import timezone

        import livestate
        from inventory import liveness
        from inventory.models import Liveness

        drive(HEARTBEAT, len(fleet))  # every node alive and its card and shard list cached
        drive(EMPTY, 200)
        heartbeat, empty = drive(HEARTBEAT, args.beats), drive(EMPTY, args.beats)
        heartbeat2, empty2 = drive(HEARTBEAT, args.beats), drive(EMPTY, args.beats)
        heartbeat, empty = min(heartbeat, heartbeat2), min(empty, empty2)
        print(
            f"CPU per request in one process: heartbeat {heartbeat:.0f} µs, empty view {empty:.0f} µs, "
            f"ratio {heartbeat / empty:.2f}"
        )
        profiler = cProfile.Profile(time.process_time)
        if args.cold:
            cold = min(drive_cold(args.beats), drive_cold(args.beats))
            print(f"CPU per cold heartbeat ({args.cold}): {cold:.0f} µs, {cold / heartbeat:.1f} × the ordinary one")
            # Side by side: an ordinary pass over the fleet, then a cold one, in turn, so that a
            # machine whose load changes slows both alike; the median of the pairs' ratios.
            pairs = []
            for _ in range(args.pairs):
                ordinary = drive(HEARTBEAT, len(fleet))
                pairs.append((ordinary, drive_cold(len(fleet))))
            ratios = sorted(c / o for o, c in pairs)
            middle = len(pairs) // 2
            ordinary_median = sorted(o for o, _ in pairs)[middle]
            cold_median = sorted(c for _, c in pairs)[middle]
            print(
                f"side by side, {len(pairs)} pairs of passes over the fleet: ordinary median "
                f"{ordinary_median:.0f} µs, cold median {cold_median:.0f} µs, "
                f"cold / ordinary median {ratios[middle]:.1f} × (range {ratios[0]:.1f}–{ratios[-1]:.1f})"
            )
            drive_cold(args.beats, profiler)
        else:
            profiler.enable()
            drive(HEARTBEAT, args.beats)
            profiler.disable()
        stats = pstats.Stats(profiler)
        stats.sort_stats("cumulative").print_stats(args.top)
        stats.sort_stats("tottime").print_stats(args.top)
    finally:
        redis.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
