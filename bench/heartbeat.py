"""Heartbeats per second against the real server, beside an empty Django view on the same server.

Starts the stack as `make run` does (gunicorn with 2 × cores + 1 workers, Celery worker and
beat, its own redis-server) on PostgreSQL, registers a simulated fleet through
the API, then drives `wrk` (C, two threads, a Lua script rotating through every
node's token and a realistic body built from the protocol types) at
POST /api/v1/heartbeat and at an empty view routed only for this benchmark
(LLMGW_BENCH_EMPTY_VIEW). Both are measured in the same run, in alternating
rounds, and the medians reported. wrk's own CPU time is reported too, to show it is
not what limits the figures.

    python -m bench.heartbeat [--nodes 10000] [--seconds 60] [--rounds 6] [--connections 32]

The fleet size does not change what one heartbeat costs (a node's card is one
Redis key), but it must be small enough that wrk's rotation reaches every node
within LLMGW_UNREACHABLE_AFTER (30 s) at the rate the machine manages: otherwise
nodes go unreachable and the run measures revivals, which write the database.
The run reports how many liveness changes happened while it measured; it
should be none.

Needs PostgreSQL at BENCH_POSTGRES (default postgres://postgres@127.0.0.1:5432),
where it recreates the database llmgw_bench_heartbeat, and wrk (apt-get install wrk).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import psutil
import requests

from agent import protocol
from devstack.ports import free_port
from devstack.stack import Stack, default_workers

ROOT = Path(__file__).resolve().parent.parent

DATABASE = "llmgw_bench_heartbeat"
JOIN_TOKEN = "bench-join-token"
RESULTS = ROOT / "bench" / "results" / "heartbeat.json"


def recreate_database(server: str) -> str:
    import psycopg

    with psycopg.connect(f"{server}/postgres", autocommit=True) as connection:
        connection.execute(f"DROP DATABASE IF EXISTS {DATABASE} WITH (FORCE)")
        connection.execute(f"CREATE DATABASE {DATABASE}")
    return f"{server}/{DATABASE}"


def inventory(index: int) -> protocol.Inventory:
    """A GPU node as an agent reports it: 8 GPUs, two filesystems, a few weights, one fabric."""
    name = f"node-{index:05d}"
    return protocol.Inventory(
        hostname=f"{name}.fleet.example",
        mgmt_addr=f"10.{index // 65536}.{index // 256 % 256}.{index % 256}",
        labels={"rack": f"r{index // 40}", "zone": "a"},
        memory_total_bytes=2 * 2**40,
        host=protocol.Host(os="Debian GNU/Linux", os_version="12", kernel="6.1.0", arch="x86_64", cpus=192),
        agent_version="0.1.0",
        engine_versions={"vllm": "0.9.1", "llama.cpp": "b5000"},
        engines_probed=True,
        gpus=[
            protocol.GPU(index=i, uuid=f"GPU-{index:05d}-{i}", name="NVIDIA H100 80GB HBM3", memory_bytes=80 * 2**30)
            for i in range(8)
        ],
        filesystems=[
            protocol.Filesystem(mount="/", fstype="ext4", total_bytes=2 * 10**12, free_bytes=10**12),
            protocol.Filesystem(mount="/models", fstype="nfs", total_bytes=10**14, free_bytes=10**13, shared=True),
        ],
        weights=[
            protocol.Weights(path=f"/models/model-{m}", size_bytes=10**11, format="safetensors") for m in range(4)
        ],
        weights_scanned=True,
        fabrics=[protocol.Fabric(name="ib-a", hcas=[f"mlx5_{h}" for h in range(4)], rate_gbps=400)],
    )


def heartbeat_body(index: int, inventory_hash: str) -> bytes:
    """An unchanged-inventory heartbeat with a load and two running shards."""
    shards = [f"node-{index:05d}-s{s}" for s in range(2)]
    beat = protocol.Heartbeat(
        inventory_hash=inventory_hash,
        load=protocol.Load(
            cpu_percent=37.5,
            cpus=192,
            load1=40.1,
            load5=38.7,
            load15=35.2,
            memory_used_bytes=900 * 2**30,
            memory_available_bytes=1100 * 2**30,
            interval_seconds=5.0,
            shards=[protocol.ShardLoad(shard=s, cpu_cores=12.5, rss_bytes=200 * 2**30) for s in shards],
        ),
        shards=[
            protocol.ShardStatus(shard=s, state="running", pid=1000 + i, metrics_port=9000 + i)
            for i, s in enumerate(shards)
        ],
        sent_at=time.time(),
    )
    return protocol.encode(beat)


def register_fleet(base: str, nodes: int) -> list[str]:
    """Register every node through the API, as agents would; returns the node tokens."""

    def register(index: int) -> str:
        session = session_of_this_thread()
        message = protocol.Register(node_id=f"node-{index:05d}", inventory=inventory(index), inventory_hash=f"h{index}")
        response = session.post(
            f"{base}/api/v1/register",
            data=protocol.encode(message),
            headers={"Authorization": f"Bearer {JOIN_TOKEN}", "Content-Type": "application/json"},
            timeout=30,
        )
        response.raise_for_status()
        return protocol.decode(response.content, protocol.Registered).token

    with ThreadPoolExecutor(8) as pool:
        return list(pool.map(register, range(nodes)))


_sessions = threading.local()


def session_of_this_thread() -> requests.Session:
    if not hasattr(_sessions, "session"):
        _sessions.session = requests.Session()
    return _sessions.session


def beat_every_node_once(base: str, tokens: list[str]) -> None:
    """Bring every node alive (the first registered may have gone unreachable) and cache its card."""

    def beat(index: int) -> None:
        response = session_of_this_thread().post(
            f"{base}/api/v1/heartbeat",
            data=heartbeat_body(index, f"h{index}"),
            headers={"Authorization": f"Bearer {tokens[index]}", "Content-Type": "application/json"},
            timeout=30,
        )
        response.raise_for_status()

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(beat, range(len(tokens))))


def cpu_seconds(stack: Stack, names: tuple[str, ...]) -> float:
    """CPU time used so far by these parts of the stack, their children included."""
    total = 0.0
    for name in names:
        part = stack.parts.get(name)
        if part is None:
            continue
        root = psutil.Process(part.process.pid)
        for process in [root, *root.children(recursive=True)]:
            try:
                times = process.cpu_times()
            except psutil.NoSuchProcess:
                continue
            total += times.user + times.system
    return total


WRK_THREADS = 2
# Per path, how far wrk's threads have gone through their nodes, so that each
# run carries on where the last stopped rather than beating the same nodes again.
_positions: dict[str, int] = {}


def run_wrk(stack: Stack, path: str, data_file: Path, seconds: int, connections: int) -> dict:
    url = f"http://127.0.0.1:{stack.web_port}"
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    server_before = cpu_seconds(stack, ("web", "redis", "celery"))
    redis_before = cpu_seconds(stack, ("redis",))
    completed = subprocess.run(
        [
            "wrk",
            "--threads",
            str(WRK_THREADS),
            "--connections",
            str(connections),
            "--duration",
            f"{seconds}s",
            "--timeout",
            "5s",
            "--script",
            str(ROOT / "bench" / "heartbeat.lua"),
            url + path,
            "--",
            str(data_file),
            path,
            str(_positions.get(path, 0)),
            str(WRK_THREADS),
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    server_cpu = cpu_seconds(stack, ("web", "redis", "celery")) - server_before
    redis_cpu = cpu_seconds(stack, ("redis",)) - redis_before
    figures = json.loads(completed.stdout.strip().splitlines()[-1])
    _positions[path] = _positions.get(path, 0) + figures["requests"] // WRK_THREADS
    seconds_run = figures["duration_us"] / 1e6
    return {
        "per_second": figures["requests"] / seconds_run,
        "p50_ms": figures["p50_us"] / 1000,
        "p99_ms": figures["p99_us"] / 1000,
        "errors": sum(figures[k] for k in ("connect", "read", "write", "status", "timeout")),
        "requests": figures["requests"],
        "wrk_cores": (after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime) / seconds_run,
        # CPU of gunicorn, Redis and Celery per answered request: unlike the
        # rate, this hardly depends on what else the shared machine is doing.
        "server_cpu_us": 1e6 * server_cpu / max(figures["requests"], 1),
        "redis_cpu_us": 1e6 * redis_cpu / max(figures["requests"], 1),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=10_000)
    parser.add_argument("--seconds", type=int, default=60, help="per target, split over the rounds")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--connections", type=int, default=32)
    parser.add_argument(
        "--unreachable-after", type=float, default=900.0, help="seconds of silence before unreachable (default 900)"
    )
    parser.add_argument(
        "--workers", type=int, default=default_workers(), help="gunicorn workers (make run starts 2 × cores + 1)"
    )
    args = parser.parse_args()
    if shutil.which("wrk") is None:
        print("wrk is not installed: apt-get install wrk", file=sys.stderr)
        return 1

    database_url = recreate_database(os.environ.get("BENCH_POSTGRES", "postgres://postgres@127.0.0.1:5432"))
    var = Path(tempfile.mkdtemp(prefix="llmgw-bench-heartbeat-"))
    stack = Stack(
        var,
        env={
            "DATABASE_URL": database_url,
            "REDIS_URL": f"redis://127.0.0.1:{free_port()}/0",
            "LLMGW_JOIN_TOKEN": JOIN_TOKEN,
            "LLMGW_BENCH_EMPTY_VIEW": "true",
            # The whole simulated fleet registers from this one address; the
            # per-token heartbeat limit stays as in production.
            "LLMGW_REGISTER_PER_MINUTE": str(max(args.nodes * 2, 100)),
            # Registering 10,000 nodes takes longer than 30 s, so with the default
            # threshold the first nodes are unreachable before measuring starts and
            # every round pays for revivals. This measures the steady state of a
            # live fleet; --unreachable-after 30 shows the registration burst too.
            "LLMGW_UNREACHABLE_AFTER": str(args.unreachable_after),
            "LLMGW_LOST_AFTER": str(args.unreachable_after * 10),
        },
        web_port=free_port(),
        workers=args.workers,
    )
    per_round = max(args.seconds // args.rounds, 1)
    rounds = {"heartbeat": [], "empty": []}
    try:
        stack.start(stack.redis_part())
        stack.prepare()
        stack.start_web()
        base = f"http://127.0.0.1:{stack.web_port}"

        # Celery (the sweeper) starts once every node has beaten: a fleet that
        # takes minutes to register would otherwise be marked unreachable before
        # its first heartbeat, and the run would measure revivals.
        started = time.monotonic()
        tokens = register_fleet(base, args.nodes)
        print(f"registered {len(tokens)} nodes in {time.monotonic() - started:.1f} s", file=sys.stderr)
        data_file = write_fleet_file(var / "fleet.tsv", tokens)
        beat_every_node_once(base, tokens)
        stack.start(stack.celery_part())
        run_wrk(stack, "/api/v1/heartbeat", data_file, 10, args.connections)  # warm-up
        # Alternate short rounds, so that both targets see the same moods of a
        # shared machine; an empty round is short enough that no node falls
        # silent past the unreachable threshold meanwhile.
        measuring_since = time.time()
        for _ in range(args.rounds):
            rounds["empty"].append(run_wrk(stack, "/api/v1/bench-empty", data_file, per_round, args.connections))
            rounds["heartbeat"].append(run_wrk(stack, "/api/v1/heartbeat", data_file, per_round, args.connections))
        fleet = fleet_after(stack, measuring_since)
    finally:
        stack.stop_all()
        shutil.rmtree(var, ignore_errors=True)

    report(rounds, args, fleet)
    return 0


def write_fleet_file(path: Path, tokens: list[str]) -> Path:
    """One "token<TAB>body" line per node, for the wrk script."""
    with path.open("wb") as out:
        for index, token in enumerate(tokens):
            out.write(token.encode() + b"\t" + heartbeat_body(index, f"h{index}") + b"\n")
    return path


def fleet_after(stack: Stack, since: float) -> dict:
    """Nodes alive after the run, and liveness changes while it measured (there should be none)."""
    script = (
        "import datetime, json; from inventory.models import Node, NodeEvent; "
        f"since = datetime.datetime.fromtimestamp({since}, datetime.UTC); "
        "print(json.dumps({'alive': Node.objects.filter(liveness='alive').count(), "
        "'changes': NodeEvent.objects.filter(kind='liveness', at__gte=since).count()}))"
    )
    result = stack.manage("shell", "-c", script, capture=True)
    return json.loads(result.stdout.strip().splitlines()[-1])


def median(rounds: list[dict], key: str) -> float:
    return statistics.median(r[key] for r in rounds)


def report(rounds: dict, args, fleet: dict) -> None:
    heartbeat, empty = rounds["heartbeat"], rounds["empty"]
    share = 100 * median(heartbeat, "per_second") / median(empty, "per_second")
    figures = [
        ("heartbeats_per_second", median(heartbeat, "per_second"), "1/s", 2000, "higher"),
        ("heartbeat_p50_latency", median(heartbeat, "p50_ms"), "ms", None, "lower"),
        ("heartbeat_p99_latency", median(heartbeat, "p99_ms"), "ms", 50, "lower"),
        ("heartbeat_errors", sum(r["errors"] for r in heartbeat), "requests", 0, "lower"),
        ("empty_view_per_second", median(empty, "per_second"), "1/s", None, "higher"),
        ("empty_view_p50_latency", median(empty, "p50_ms"), "ms", None, "lower"),
        ("empty_view_p99_latency", median(empty, "p99_ms"), "ms", None, "lower"),
        ("empty_view_errors", sum(r["errors"] for r in empty), "requests", None, "lower"),
        ("heartbeat_share_of_empty_view", share, "%", 60, "higher"),
        ("heartbeat_server_cpu_per_request", median(heartbeat, "server_cpu_us"), "µs", None, "lower"),
        ("heartbeat_redis_server_cpu_per_request", median(heartbeat, "redis_cpu_us"), "µs", None, "lower"),
        ("empty_view_server_cpu_per_request", median(empty, "server_cpu_us"), "µs", None, "lower"),
        ("load_generator_cpu", median(heartbeat, "wrk_cores"), "cores", None, "lower"),
        ("nodes_alive_after_run", fleet["alive"], "nodes", args.nodes, "higher"),
        ("liveness_changes_while_measuring", fleet["changes"], "events", 0, "lower"),
    ]
    print(
        f"\n{args.nodes} nodes, {args.workers} gunicorn workers, {args.connections} connections, "
        f"{args.rounds} rounds of {max(args.seconds // args.rounds, 1)} s per target (medians); "
        "2-core machine shared with other work\n"
    )
    print("| figure | value | unit | target |")
    print("| --- | ---: | --- | ---: |")
    for name, value, unit, target, better in figures:
        goal = "" if target is None else f"{'≥' if better == 'higher' else '≤'} {target}"
        print(f"| {name} | {value:,.{1 if abs(value) >= 10 else 2}f} | {unit} | {goal} |")
    if fleet["changes"]:
        print(
            f"\nWarning: {fleet['changes']} liveness changes while measuring: the rate was too low to reach every "
            "node within LLMGW_UNREACHABLE_AFTER, so the heartbeat figures include revivals (database writes)."
        )
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(
        json.dumps(
            [
                {"name": name, "value": round(value, 3), "unit": unit, "target": target, "better": better}
                for name, value, unit, target, better in figures
            ],
            indent=2,
        )
        + "\n"
    )


if __name__ == "__main__":
    sys.exit(main())
