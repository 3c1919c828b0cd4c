"""HAProxy's Runtime API, as the sync reads and repairs it: servers, maps, and the master's reload.

What HAProxy actually has is read here, never remembered: after a restart or a reload the
answers change, and the sync compares them with what should be.
"""

from __future__ import annotations

import socket
from dataclasses import dataclass
from pathlib import Path

# `show servers state` srv_admin_state bits (HAProxy's SRV_ADMF_*).
FORCED_MAINT = 0x01
INHERITED_MAINT = 0x02
CONFIG_MAINT = 0x04
FORCED_DRAIN = 0x08
INHERITED_DRAIN = 0x10
RESOLVER_MAINT = 0x20
MAINT = FORCED_MAINT | INHERITED_MAINT | CONFIG_MAINT | RESOLVER_MAINT
DRAIN = FORCED_DRAIN | INHERITED_DRAIN


class RuntimeError_(Exception):
    """HAProxy refused a command, or could not be reached."""


@dataclass(frozen=True)
class ActualServer:
    name: str
    address: str
    port: int
    weight: int
    admin_state: int

    @property
    def state(self) -> str:
        if self.admin_state & MAINT:
            return "maint"
        if self.admin_state & DRAIN:
            return "drain"
        return "ready"


def ask(socket_path: Path, command: str, timeout: float = 2.0) -> str:
    """One command on a stats or master socket; its whole answer."""
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(timeout)
            sock.connect(str(socket_path))
            sock.sendall(command.encode() + b"\n")
            # The master's CLI waits for more commands until the client's side is closed.
            sock.shutdown(socket.SHUT_WR)
            chunks = []
            while chunk := sock.recv(65536):
                chunks.append(chunk)
    except OSError as exc:
        raise RuntimeError_(f"{socket_path}: {exc}") from exc
    return b"".join(chunks).decode()


class Runtime:
    def __init__(self, admin_socket: Path, master_socket: Path | None = None):
        self.admin_socket = admin_socket
        self.master_socket = master_socket

    def ask(self, command: str) -> str:
        return ask(self.admin_socket, command)

    def worker_pid(self) -> int:
        """The process answering the admin socket: after a reload, a new one."""
        for line in self.ask("show info").splitlines():
            if line.startswith("Pid:"):
                return int(line.split(":", 1)[1])
        raise RuntimeError_("show info gave no Pid")

    def backends(self) -> set[str]:
        lines = self.ask("show backend").splitlines()
        return {line.strip() for line in lines[1:] if line.strip()}

    def servers(self, backend: str = "") -> dict[str, dict[str, ActualServer]]:
        """`show servers state` (of one backend, or of all in one round trip): backend → name → its state."""
        answer = self.ask(f"show servers state {backend}".strip())
        lines = [line for line in answer.splitlines()[1:] if line and not line.startswith("#")]
        servers: dict[str, dict[str, ActualServer]] = {}
        for line in lines:
            f = line.split()
            # be_id be_name srv_id srv_name srv_addr srv_op_state srv_admin_state srv_uweight srv_iweight
            # srv_time_since_last_change ... srv_fqdn srv_port ...
            server = ActualServer(name=f[3], address=f[4], port=int(f[18]), weight=int(f[7]), admin_state=int(f[6]))
            servers.setdefault(f[1], {})[server.name] = server
        return servers

    def in_flight(self) -> dict[tuple[str, str], int]:
        """`show stat`: (backend, server) → requests on it now, being answered (scur) or queued for it (qcur)."""
        lines = self.ask("show stat").splitlines()
        if not lines or not lines[0].startswith("# "):
            raise RuntimeError_(f"show stat: {lines[:1]}")
        columns = lines[0][2:].split(",")
        proxy, server = columns.index("pxname"), columns.index("svname")
        current, queued = columns.index("scur"), columns.index("qcur")
        counts = {}
        for line in lines[1:]:
            f = line.split(",")
            if len(f) < len(columns) or f[server] in ("FRONTEND", "BACKEND"):
                continue
            counts[(f[proxy], f[server])] = int(f[current] or 0) + int(f[queued] or 0)
        return counts

    def server_limits(self) -> dict[tuple[str, str], int]:
        """`show stat`: (backend, server) → its maxconn (`slim`), 0 for none."""
        lines = self.ask("show stat").splitlines()
        if not lines or not lines[0].startswith("# "):
            raise RuntimeError_(f"show stat: {lines[:1]}")
        columns = lines[0][2:].split(",")
        proxy, server, limit = columns.index("pxname"), columns.index("svname"), columns.index("slim")
        return {
            (f[proxy], f[server]): int(f[limit] or 0)
            for f in (line.split(",") for line in lines[1:])
            if len(f) >= len(columns) and f[server] not in ("FRONTEND", "BACKEND")
        }

    def map_entries(self, path: Path) -> dict[str, str]:
        entries = {}
        for line in self.ask(f"show map {path}").splitlines():
            parts = line.split(" ", 2)
            if len(parts) == 3 and parts[0].startswith("0x"):
                entries[parts[1]] = parts[2]
        return entries

    def table_entries(self, table: str, where: str = "") -> dict[str, dict[str, int]]:
        """`show table` (its entries matching `where`, e.g. `data.gpt0 gt 0`): key → counters and `exp` (ms left)."""
        entries = {}
        for line in self.ask(f"show table {table} {where}".strip()).splitlines():
            if not line.startswith("0x"):
                continue
            fields = dict(word.split("=", 1) for word in line.split()[1:] if "=" in word)
            key = fields.pop("key", None)
            if key is not None:
                entries[key] = {name.split("(", 1)[0]: int(value) for name, value in fields.items() if value.isdigit()}
        return entries

    def command(self, command: str, ok: tuple[str, ...] = ("",)) -> str:
        """A change; raises unless HAProxy's answer starts with one of `ok` (most changes answer nothing)."""
        answer = self.ask(command).strip()
        if not any(answer.startswith(prefix) for prefix in ok):
            raise RuntimeError_(f"{command.split(' ', 3)[:3]}: {answer}")
        return answer

    def reload(self) -> None:
        """The master reloads the config: new workers start, old ones finish their requests (master-worker mode)."""
        if self.master_socket is None:
            raise RuntimeError_("no master socket: HAProxy must run in master-worker mode (-W -S) to be reloaded")
        ask(self.master_socket, "reload")
