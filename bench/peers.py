"""What holding tenants' limits across gateways costs: one gateway alone, its rules summed, one of three peered.

"alone": deploy/gateway.cfg as the sync renders it for a single gateway (its tenant's limits
checked against its own stick table). "peered": the same for gateway gw-a of three (gw-a, gw-b,
gw-c, all running and connected): its own table plus the other two's, replicated by HAProxy's
peers, summed by the limit rules, and each admitted request writing its requests in flight for
the others. "summed": gw-a's config with its peers never started (the summing rules alone, nothing
replicated). All with a tenant whose requests-per-second and concurrency limits are too high to
refuse anything, so every rule runs; the Lua usage filter is taken out of all (its cost is
bench.tenants's) so that the difference is the rules'. In front of the same engine that costs
nothing (an HAProxy answering a fixed chat completion), rotating the order each round so the machine's
load falls on all alike:

- p50 and p99 latency over one kept-alive connection, and the gateway's CPU per request (schedstat);
- the CPU the replication costs a peer receiving it (gw-b's worker, per request gw-a admitted);
- how long a request admitted on gw-a takes to show in gw-b's copy of gw-a's table (the CLI polled).

    python -m bench.peers [--requests 3000] [--rounds 5] [--lags 200]
"""

from __future__ import annotations

import argparse
import hashlib
import http.client
import os
import signal
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

from bench.agent_cost import cpu_ns, write_results
from bench.tenants import KEY, SECRET, fixed_engine, percentile, start, whole_answers, worker_pid
from devstack import gateway as devgateway
from devstack.polling import wait_until
from devstack.ports import free_port, port_open
from gateway import haproxy_config
from gateway.haproxy_config import Backend, Desired, Frontend, Paths, Peer, Peering, Server
from gateway.runtime import Runtime

TENANT = "bench"
NAMES = ("gw-a", "gw-b", "gw-c")
# "summed": the peered config with its two peers never started, so the rules run and nothing is replicated.
SIDES = ("alone", "summed", "peered")


def lag_key(sample: int) -> str:
    return f"{KEY}-lag-{sample}"


def desired(engine: int, lags: int) -> Desired:
    keys = {hashlib.sha256(lag_key(sample).encode()).hexdigest(): f"lag-{sample}" for sample in range(lags)}
    return Desired(
        backends={"fixed": Backend("fixed", SECRET, (Server("fixed-r1", "127.0.0.1", engine),))},
        keys={hashlib.sha256(KEY.encode()).hexdigest(): TENANT, **keys},
        requests_per_second={TENANT: "1000000"},
        concurrent_requests={TENANT: "1000"},
    )


def gateway(directory: Path, engine: int, peering: Peering | None, lags: int) -> tuple[subprocess.Popen, int]:
    port = free_port()
    paths = Paths(directory)
    haproxy_config.write_all(paths, Frontend(f"127.0.0.1:{port}", peering=peering), desired(engine, lags))
    lines = paths.config.read_text().splitlines()
    paths.config.write_text("\n".join(line for line in lines if "lua" not in line) + "\n")
    process = start(devgateway.haproxy_command(directory), env=devgateway.HAPROXY_ENV)
    wait_until(lambda: port_open(port), 10, "the gateway")
    return process, port


def connected(directory: Path) -> bool:
    remote = [
        line for line in Runtime(Paths(directory).admin_socket).ask("show peers").splitlines() if "(remote," in line
    ]
    return len(remote) == len(NAMES) - 1 and all("last_status=ESTA" in line for line in remote)


def replication_lag(port: int, b_directory: Path, samples: int) -> list[float]:
    """Seconds from a request's answer on gw-a to its tenant's entry in gw-b's copy of gw-a's table (a fresh
    tenant each time, so that the entry's arrival is the sign)."""
    runtime = Runtime(Paths(b_directory).admin_socket)
    table = haproxy_config.tenants_table(NAMES[0])
    connection = http.client.HTTPConnection("127.0.0.1", port)
    lags = []
    for sample in range(samples):
        connection.request("GET", "/v1/models", headers={"Authorization": f"Bearer {lag_key(sample)}"})
        answer = connection.getresponse()
        answer.read()
        answered = time.perf_counter()
        while f"lag-{sample}" not in runtime.table_entries(table, f"key lag-{sample}"):
            if time.perf_counter() - answered > 1:
                raise RuntimeError(f"gw-a's admission of lag-{sample} not seen on gw-b within a second")
        lags.append(time.perf_counter() - answered)
    connection.close()
    return lags


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.peers", description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=3000, help="whole answers per round and side")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--lags", type=int, default=200, help="samples of the replication delay")
    args = parser.parse_args(argv)
    processes: list[subprocess.Popen] = []
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp)
        try:
            engine, engine_port = fixed_engine(directory)
            processes.append(engine)
            alone, alone_port = gateway(directory / "alone", engine_port, None, args.lags)
            processes.append(alone)
            lonely = tuple(Peer(f"{name}-down", f"127.0.0.1:{free_port()}") for name in NAMES)
            summed, summed_port = gateway(directory / "summed", engine_port, Peering("gw-a-down", lonely), args.lags)
            processes.append(summed)
            peers = tuple(Peer(name, f"127.0.0.1:{free_port()}") for name in NAMES)
            peered = {}
            for name in NAMES:
                process, port = gateway(directory / name, engine_port, Peering(name, peers), args.lags)
                processes.append(process)
                peered[name] = (process, port)
            wait_until(lambda: all(connected(directory / name) for name in NAMES), 10, "the peers to connect")
            sides = {
                "alone": (alone_port, worker_pid(alone)),
                "summed": (summed_port, worker_pid(summed)),
                "peered": (peered["gw-a"][1], worker_pid(peered["gw-a"][0])),
            }
            receiver = worker_pid(peered["gw-b"][0])
            p50: dict[str, list[float]] = {side: [] for side in SIDES}
            p99: dict[str, list[float]] = {side: [] for side in SIDES}
            cpu: dict[str, list[float]] = {side: [] for side in SIDES}
            received: list[float] = []
            for side in SIDES:
                whole_answers(sides[side][0], 200)
            for round_ in range(args.rounds):
                for side in SIDES[round_ % 3 :] + SIDES[: round_ % 3]:
                    port, pid = sides[side]
                    before, before_receiver = cpu_ns(pid), cpu_ns(receiver)
                    took = whole_answers(port, args.requests)
                    cpu[side].append((cpu_ns(pid) - before) / args.requests / 1000)
                    if side == "peered":
                        received.append((cpu_ns(receiver) - before_receiver) / args.requests / 1000)
                    p50[side].append(statistics.median(took) * 1e6)
                    p99[side].append(percentile(took, 0.99) * 1e6)
            lags = replication_lag(peered["gw-a"][1], directory / "gw-b", args.lags)
        finally:
            for process in processes:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()

    def median(values: list[float]) -> float:
        return round(statistics.median(values), 1)

    def row(name: str, value: float, unit: str = "µs") -> dict:
        return {"name": name, "value": value, "unit": unit, "target": None, "better": "lower"}

    rows = []
    for side in SIDES:
        rows += [
            row(f"p50_{side}_us", median(p50[side])),
            row(f"p99_{side}_us", median(p99[side])),
            row(f"cpu_per_request_{side}_us", median(cpu[side])),
        ]
    rows += [
        row("p50_added_by_summed_rules_us", round(median(p50["summed"]) - median(p50["alone"]), 1)),
        row("cpu_per_request_added_by_summed_rules_us", round(median(cpu["summed"]) - median(cpu["alone"]), 1)),
        row("p50_added_by_peers_us", round(median(p50["peered"]) - median(p50["alone"]), 1)),
        row("cpu_per_request_added_by_peers_us", round(median(cpu["peered"]) - median(cpu["alone"]), 1)),
        row("cpu_per_request_on_a_receiving_peer_us", median(received)),
        row("replication_p50_ms", round(statistics.median(lags) * 1000, 2), "ms"),
        row("replication_p99_ms", round(percentile(lags, 0.99) * 1000, 2), "ms"),
        row("replication_max_ms", round(max(lags) * 1000, 2), "ms"),
        {"name": "rounds", "value": args.rounds, "unit": "", "target": None, "better": "higher"},
    ]
    write_results("peers", rows)
    print("replication (ms), percentiles 50/90/99:", [round(percentile(lags, q) * 1000, 2) for q in (0.5, 0.9, 0.99)])


if __name__ == "__main__":
    main()
