"""Real services for tests: free ports, a private redis-server, deadlines, Redis or the database cut off."""

from __future__ import annotations

import shutil
import socket
import sqlite3
import subprocess
import tempfile
import time
import uuid
from collections.abc import Callable
from contextlib import contextmanager
from pathlib import Path


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_until(condition: Callable[[], bool], timeout: float, what: str, interval: float = 0.05) -> None:
    """Poll `condition` until it holds; fail naming `what` once the deadline passes."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(interval)
    raise TimeoutError(f"timed out after {timeout:g} s waiting for {what}")


def port_open(port: int, host: str = "127.0.0.1") -> bool:
    try:
        with socket.create_connection((host, port), timeout=0.2):
            return True
    except OSError:
        return False


class RedisServer:
    """A redis-server of the test run's own, on a free port, keeping nothing on disk."""

    def __init__(self, workdir: Path):
        binary = shutil.which("redis-server")
        if binary is None:
            raise RuntimeError("redis-server is not installed: apt-get install redis-server")
        self.workdir = workdir
        self.port = free_port()
        self.binary = binary
        self.process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> RedisServer:
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.process = subprocess.Popen(
            [
                self.binary,
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                str(self.workdir),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        wait_until(lambda: port_open(self.port), 10, f"redis-server on port {self.port}")
        return self

    def stop(self) -> None:
        if self.process and self.process.poll() is None:
            self.process.terminate()
            self.process.wait(10)
        wait_until(lambda: not port_open(self.port), 10, f"redis-server on port {self.port} to stop")


@contextmanager
def redis_unreachable(settings):
    """Point the control plane at a port where no Redis answers, for the duration of the block."""
    import livestate

    settings.REDIS_URL = f"redis://127.0.0.1:{free_port()}/0"
    livestate.reset_client()
    try:
        yield
    finally:
        livestate.reset_client()


@contextmanager
def database_unreachable():
    """Point the default database connection where no database can be opened, for the duration of the block.

    The driver fails for real: SQLite is given a file in a directory that does
    not exist, PostgreSQL a port where nothing listens. Tests using it need
    `django_db(transaction=True)`, since the connection is closed and opened again.
    """
    from django.db import connection

    saved = dict(connection.settings_dict)
    keeper = None
    if connection.vendor == "sqlite":
        if connection.is_in_memory_db():
            # Closing the last connection to an in-memory database destroys it: hold another open meanwhile.
            keeper = sqlite3.connect(saved["NAME"], uri=True)
        missing_directory = Path(tempfile.gettempdir()) / f"llmgw-no-such-directory-{uuid.uuid4().hex}"
        connection.settings_dict["NAME"] = str(missing_directory / "db.sqlite3")
    else:
        connection.settings_dict.update(HOST="127.0.0.1", PORT=str(free_port()))
    connection.close()
    try:
        yield
    finally:
        connection.close()
        connection.settings_dict.clear()
        connection.settings_dict.update(saved)
        connection.ensure_connection()
        if keeper is not None:
            keeper.close()
