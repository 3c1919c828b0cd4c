"""What glibc's adaptive heap costs the web tier's HAProxy, with and without devstack.proxy.HAPROXY_ENV.

    python -m bench.fleetlib.proxy_heap [--rounds 3] [--seconds 4] [--connections 8]

deploy/haproxy.cfg rendered as `make run` renders it, in front of a stub web server (a second
HAProxy answering every request with a heartbeat's answer), driven by `wrk` with heartbeat-sized
POSTs: over kept connections, and with a new connection each (`Connection: close`). Each round
starts the proxy afresh for each way and each environment, in turns, so a busy moment of the shared
machine falls on all alike; it prints HAProxy's CPU a request (`/proc/PID/stat`) in every round and
the median, and, in a last round under `strace -c -f`, its heap calls (`brk`, `mmap`, `munmap`) a
request, which no load on the machine moves. docs/operations.md, "The proxy's heap", quotes it.
"""

from __future__ import annotations

import argparse
import itertools
import os
import re
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

import psutil

from devstack import proxy
from devstack.polling import wait_until
from devstack.ports import free_port, port_open

# A heartbeat's body is 742 bytes on average (docs/operations.md, "The benchmark").
BODY_BYTES = 742
ENVIRONMENTS = {"adaptive": {}, "fixed": proxy.HAPROXY_ENV}
WAYS = {"kept": [], "connecting": ["-H", "Connection: close"]}
HEAP_CALLS = ("brk", "mmap", "munmap")


def stub_config(port: int) -> str:
    return (
        "global\n    nbthread 1\n"
        "defaults\n    mode http\n    timeout client 30s\n    timeout server 30s\n    timeout connect 2s\n"
        f"frontend stub\n    bind 127.0.0.1:{port}\n"
        '    http-request return status 200 content-type application/json string \'{"state":"ready"}\'\n'
    )


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def drive(wrk: list[str]) -> int:
    """Requests `wrk` had answered by its end."""
    out = subprocess.run(wrk, capture_output=True, text=True, check=True).stdout
    found = re.search(r"(\d+) requests in", out)
    assert found, out
    return int(found.group(1))


def heap_calls(summary: str) -> dict[str, int]:
    """`strace -c`'s call counts of the heap's system calls."""
    calls = dict.fromkeys(HEAP_CALLS, 0)
    for line in summary.splitlines():
        # "% time  seconds  usecs/call  calls  [errors]  syscall"
        parts = line.split()
        if len(parts) >= 5 and parts[-1] in calls:
            calls[parts[-1]] = int(parts[3])
    return calls


def measure(config: Path, port: int, env: dict[str, str], wrk: list[str], strace_out: Path | None) -> tuple[int, float]:
    """Requests `wrk` had answered through a fresh proxy, and the proxy's CPU seconds meanwhile (strace's when
    traced, which the caller leaves unused)."""
    command = [proxy.haproxy_binary(), "-db", "-f", str(config)]
    if strace_out is not None:
        command = ["strace", "-c", "-f", "-o", str(strace_out), *command]
    process = subprocess.Popen(command, env={**os.environ, **env}, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_until(lambda: port_open(port), 10, "the proxy")
        time.sleep(1.0)  # its first health checks
        before = cpu_seconds(process.pid)
        requests = drive(wrk)
        return requests, cpu_seconds(process.pid) - before
    finally:
        # Under strace, the proxy is strace's child: strace sent a signal only detaches and waits.
        for stopping in [*psutil.Process(process.pid).children(), process]:
            stopping.terminate()
        process.wait(10)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=int, default=4)
    parser.add_argument("--connections", type=int, default=8)
    args = parser.parse_args()
    directory = Path(tempfile.mkdtemp(prefix="proxy-heap-"))
    front, back = free_port(), free_port()
    config = directory / "front.cfg"
    config.write_text(proxy.render(f"127.0.0.1:{front}", [proxy.Backend("web", back, 64)], directory / "stats.sock"))
    (directory / "stub.cfg").write_text(stub_config(back))
    script = directory / "post.lua"
    script.write_text(
        'wrk.method = "POST"\nwrk.headers["Content-Type"] = "application/json"\n'
        f'wrk.body = "{{\\"padding\\":\\"{"x" * (BODY_BYTES - 15)}\\"}}"\n'
    )
    url = f"http://127.0.0.1:{front}/api/v1/heartbeat"
    wrk = ["wrk", "-t1", f"-c{args.connections}", f"-d{args.seconds}s", "-s", str(script)]
    stub = subprocess.Popen(
        [proxy.haproxy_binary(), "-db", "-f", str(directory / "stub.cfg")], stdout=subprocess.DEVNULL
    )
    cpu: dict[tuple[str, str], list[float]] = {}
    calls: dict[tuple[str, str], dict[str, float]] = {}
    try:
        wait_until(lambda: port_open(back), 10, "the stub server")
        for round_ in range(args.rounds):
            for (env_name, env), (way_name, way) in itertools.product(ENVIRONMENTS.items(), WAYS.items()):
                requests, used = measure(config, front, env, [*wrk, *way, url], None)
                cpu.setdefault((env_name, way_name), []).append(used / requests * 1e6)
                print(f"round {round_ + 1}: {env_name} heap, {way_name}: {used / requests * 1e6:.1f} µs a request")
        # Traced apart: strace slows the proxy, so its rounds time nothing.
        strace_out = directory / "strace.txt"
        for (env_name, env), (way_name, way) in itertools.product(ENVIRONMENTS.items(), WAYS.items()):
            requests, _ = measure(config, front, env, [*wrk, *way, url], strace_out)
            counted = heap_calls(strace_out.read_text())
            calls[env_name, way_name] = {name: n / requests for name, n in counted.items()}
    finally:
        stub.terminate()
        stub.wait(10)
    print(f"\n| heap | connections | HAProxy CPU a request, median of {args.rounds} | brk / mmap / munmap a request |")
    print("| --- | --- | ---: | ---: |")
    for key, values in cpu.items():
        heap = " / ".join(f"{calls[key][name]:.3f}" for name in HEAP_CALLS)
        print(f"| {key[0]} | {key[1]} | {statistics.median(values):.1f} µs | {heap} |")


if __name__ == "__main__":
    main()
