"""The soak's PostgreSQL: the machine's cluster, or a private one it can restart without bothering anyone.

The 20-minute soak runs on the machine's cluster (a database of its own,
restarted with `pg_ctlcluster`), as production would. The short soak in
`make test` starts a private cluster on a free port instead: restarting the
machine's cluster would break whatever else uses it at that moment.
"""

from __future__ import annotations

import contextlib
import glob
import os
import shutil
import subprocess
import tempfile
from pathlib import Path
from urllib.parse import urlparse

import psycopg
from psycopg import sql

from devstack.polling import wait_until
from devstack.ports import free_port, port_open


def recreate_database(url: str) -> None:
    """Drop and create the database `url` names, so every soak starts from nothing."""
    parsed = urlparse(url)
    name = parsed.path.lstrip("/")
    admin_url = parsed._replace(path="/postgres").geturl()
    with psycopg.connect(admin_url, autocommit=True, connect_timeout=10) as conn:
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))


def answers(url: str) -> bool:
    try:
        with psycopg.connect(url, connect_timeout=2) as conn:
            conn.execute("SELECT 1")
        return True
    except psycopg.Error:
        return False


class SharedPostgres:
    """A database on a cluster that is already running; restarted by a command (pg_ctlcluster)."""

    def __init__(self, url: str, restart_command: list[str]):
        self.url = url
        self.restart_command = restart_command

    def start(self) -> SharedPostgres:
        recreate_database(self.url)
        return self

    def restart(self) -> None:
        subprocess.run(self.restart_command, check=True, capture_output=True, timeout=120)
        wait_until(lambda: answers(self.url), 60, "PostgreSQL to answer after its restart", interval=0.2)

    def processes(self) -> list[int]:
        return []  # shared with others: its memory is not the soak's to judge

    def stop(self) -> None:
        pass


class PrivatePostgres:
    """A throw-away cluster on a free port, owned by the postgres user when we are root."""

    def __init__(self, database: str = "llmgw_soak"):
        found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
        if not found:
            raise RuntimeError("PostgreSQL is not installed: apt-get install postgresql")
        self.bin = Path(found[-1]).parent
        self.port = free_port()
        self.dir = Path(tempfile.mkdtemp(prefix="llmgw-soak-pg-"))
        self.database = database
        self.url = f"postgres://postgres@127.0.0.1:{self.port}/{database}"

    def _run(self, *args: str) -> None:
        command = [str(self.bin / args[0]), *args[1:]]
        if os.geteuid() == 0:
            command = ["runuser", "-u", "postgres", "--", *command]
        subprocess.run(command, check=True, capture_output=True, timeout=120)

    def start(self) -> PrivatePostgres:
        if os.geteuid() == 0:
            shutil.chown(self.dir, "postgres", "postgres")
        data = self.dir / "data"
        self._run("initdb", "-D", str(data), "-U", "postgres", "--auth=trust", "-E", "UTF8", "--no-sync")
        # Durability is not under test here (a restart is a clean shutdown), speed is welcome on 2 cores.
        options = f"-p {self.port} -k {self.dir} -c listen_addresses=127.0.0.1 -c fsync=off -c full_page_writes=off"
        self._run("pg_ctl", "-D", str(data), "-o", options, "-l", str(self.dir / "log"), "-w", "start")
        wait_until(lambda: port_open(self.port), 30, "the private PostgreSQL")
        recreate_database(self.url)
        self.options = options
        return self

    def restart(self) -> None:
        # With -l the server does not inherit our pipes, which would keep _run waiting for their end.
        self._run(
            "pg_ctl",
            "-D",
            str(self.dir / "data"),
            "-o",
            self.options,
            "-l",
            str(self.dir / "log"),
            "-m",
            "fast",
            "-w",
            "restart",
        )
        wait_until(lambda: answers(self.url), 60, "PostgreSQL to answer after its restart", interval=0.2)

    def processes(self) -> list[int]:
        try:
            return [int((self.dir / "data" / "postmaster.pid").read_text().split()[0])]
        except (OSError, ValueError, IndexError):
            return []

    def stop(self) -> None:
        with contextlib.suppress(subprocess.CalledProcessError):
            self._run("pg_ctl", "-D", str(self.dir / "data"), "-m", "immediate", "-w", "stop")
        shutil.rmtree(self.dir, ignore_errors=True)
