"""A private redis-server on a free port, for tests and benchmarks that must not share one."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from devstack.polling import wait_until
from devstack.ports import free_port, port_open


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
