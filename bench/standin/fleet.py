"""A fleet of stand-in engine replicas in one child process, on free loopback ports."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from bench.standin.engine import Pace
from bench.standin.proxy import Server
from devstack.polling import wait_until
from devstack.ports import free_port, port_open

ROOT = Path(__file__).resolve().parent.parent.parent


@dataclass
class Fleet:
    """`speeds` has one entry per replica (1.0 full speed, 0.5 half); every replica shares `pace` otherwise."""

    speeds: list[float]
    pace: Pace = field(default_factory=Pace)
    model: str = "standin"
    api_key: str | None = None
    ports: list[int] = field(default_factory=list)
    process: subprocess.Popen | None = None

    def __enter__(self) -> Fleet:
        self.ports = [free_port() for _ in self.speeds]
        command = [sys.executable, "-m", "bench.standin.engine", "--model", self.model]
        command += [f"--slots={self.pace.slots}", f"--decode-tps={self.pace.decode_tps}"]
        command += [f"--prefill-tps={self.pace.prefill_tps}", f"--cache-tokens={self.pace.cache_tokens}"]
        command += [f"--listen={port}:{speed}" for port, speed in zip(self.ports, self.speeds, strict=True)]
        if self.api_key:
            command.append(f"--api-key={self.api_key}")
        self.process = process = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.DEVNULL)
        try:
            wait_until(lambda: all(port_open(p) for p in self.ports) or process.poll() is not None, 20, "engines")
        except TimeoutError:
            self.__exit__()
            raise
        if process.poll() is not None:
            raise RuntimeError(f"the stand-in engines exited ({process.returncode})")
        return self

    def __exit__(self, *exc) -> None:
        if self.process and self.process.poll() is None:
            self.process.terminate()
            self.process.wait(10)

    def servers(self) -> list[Server]:
        return [Server(f"r{i}", port, self.pace.slots) for i, port in enumerate(self.ports)]
