"""HAProxy in front of the stack's web server instances: its config from deploy/haproxy.cfg, and its state.

The stack's public port is HAProxy's; each web server instance binds a loopback port
that only HAProxy uses, as each would be a host of its own in production.
"""

from __future__ import annotations

import resource
import shutil
import socket
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TEMPLATE = ROOT / "deploy" / "haproxy.cfg"
# What deploy/haproxy.cfg asks of a production host: one connection per node of a 10,000-node fleet, twice over.
PRODUCTION_MAXCONN = 20_000
# glibc's allocator, fixed for HAProxy's large buffers (the web tier's 560 KiB, the gateway's 272 KiB or
# more): left to adapt, it grows and trims the heap (or maps and unmaps a buffer) on every request, since
# `retry-on` keeps each request's copy in a buffer of its own. That cost the gateway ~250 µs of CPU a request
# (360 against 107 µs, docs/gateway.md, "What it costs") and the web tier's proxy two brk calls a request
# (docs/operations.md, "The proxy's heap"). Production sets the same in each HAProxy unit's Environment=.
HAPROXY_ENV = {"MALLOC_MMAP_THRESHOLD_": "8388608", "MALLOC_TRIM_THRESHOLD_": "67108864"}


@dataclass(frozen=True)
class Backend:
    """One web server instance as HAProxy sees it: a name, a port and how many requests it takes at once."""

    name: str
    port: int
    workers: int


def haproxy_binary() -> str:
    """Debian installs haproxy in /usr/sbin, which is not on every user's PATH."""
    found = shutil.which("haproxy") or shutil.which("haproxy", path="/usr/sbin:/usr/local/sbin")
    if found is None:
        raise RuntimeError("haproxy is not installed: apt-get install haproxy (make run installs it)")
    return found


def max_connections() -> int:
    """The production `maxconn`, or as many connections as this machine's file descriptor limit allows.

    HAProxy raises its own soft limit to the hard one and needs two descriptors
    per connection (the client's and a server's) and a few more; asked for more
    than it can have, it refuses to start. A sandbox's hard limit (20,000 on
    the project's machines) holds 9,950 connections.
    """
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY:
        return PRODUCTION_MAXCONN
    return max(min(PRODUCTION_MAXCONN, (hard - 100) // 2), 100)


def render(bind: str | list[str], backends: list[Backend], stats_socket: Path, template: str | None = None) -> str:
    """deploy/haproxy.cfg with its placeholders filled; a placeholder left over is a mistake, not a default.

    `bind` is one address, or several `bind` lines' arguments (the stack's plain
    loopback port and its HTTPS one, `… ssl crt …`).
    """
    text = TEMPLATE.read_text() if template is None else template
    if isinstance(bind, list):
        bind = "\n    bind ".join(bind)
    # One request per web worker at a time: the rest wait in HAProxy's queue, not in the server's backlog.
    servers = "\n".join(f"    server {b.name} 127.0.0.1:{b.port} maxconn {b.workers}" for b in backends)
    fields = {"bind": bind, "servers": servers, "stats_socket": str(stats_socket), "maxconn": str(max_connections())}
    for name, value in fields.items():
        text = text.replace("{{" + name + "}}", value)
    if "{{" in text:
        raise ValueError(f"unfilled placeholder in {TEMPLATE}: {text[text.index('{{') :].splitlines()[0]}")
    return text


def ask(stats_socket: Path, command: str, timeout: float = 5.0) -> str:
    """One command on HAProxy's stats socket (`show stat`, `show servers state`, …); its whole answer."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout)
        sock.connect(str(stats_socket))
        sock.sendall(command.encode() + b"\n")
        chunks = []
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks).decode()


def stats(stats_socket: Path) -> list[dict[str, str]]:
    """`show stat` as rows: pxname, svname (a server, FRONTEND or BACKEND), status, wretr, wredis, hrsp_5xx, …"""
    lines = ask(stats_socket, "show stat").splitlines()
    header = lines[0].lstrip("# ").split(",")
    return [dict(zip(header, line.split(","), strict=False)) for line in lines[1:] if line]


def server_states(stats_socket: Path, backend: str = "web") -> dict[str, str]:
    """Each server of `backend` and what the health checks make of it (UP, DOWN, …)."""
    return {
        row["svname"]: row["status"]
        for row in stats(stats_socket)
        if row["pxname"] == backend and row["svname"] not in ("FRONTEND", "BACKEND")
    }
