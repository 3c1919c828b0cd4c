"""LiteLLM's proxy, the peer bench/gateway.py measures against: its own venv, installed on first use, and run.

Benchmark-only: `litellm[proxy]` is pinned here, not in requirements.txt, and lives in
var/litellm-venv (about 750 MB). It is the newest version whose proxy extra installs from
this machine's registry (issue 23). Telemetry and the model cost map's download are off,
so it reaches nothing but the stand-in engine on loopback.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

from devstack.polling import wait_until
from devstack.ports import free_port, port_open

ROOT = Path(__file__).resolve().parent.parent.parent
VENV = ROOT / "var" / "litellm-venv"
PACKAGE = "litellm[proxy]==1.108.7"
STARTUP_SECONDS = 180


def installed() -> bool:
    return (VENV / "bin" / "litellm").exists()


def install() -> None:
    """Makes var/litellm-venv with LiteLLM's proxy (minutes, once)."""
    print(f"installing {PACKAGE} into {VENV.relative_to(ROOT)} (once)…", flush=True)
    subprocess.run([sys.executable, "-m", "venv", str(VENV)], check=True)
    pip = [str(VENV / "bin" / "pip"), "install", "--quiet", "--disable-pip-version-check", PACKAGE]
    subprocess.run(pip, check=True)


class LiteLLM:
    """`litellm --config` serving each model of `upstreams` (a name → an OpenAI-compatible base URL)."""

    def __init__(self, upstreams: dict[str, str], upstream_key: str, master_key: str):
        self.port = free_port()
        self.master_key = master_key
        self.workdir = Path(tempfile.mkdtemp(prefix="bench-litellm-"))
        config = {
            "model_list": [
                {
                    "model_name": model,
                    "litellm_params": {"model": f"openai/{model}", "api_base": api_base, "api_key": upstream_key},
                }
                for model, api_base in upstreams.items()
            ],
            "general_settings": {"master_key": master_key},
        }
        self.config = self.workdir / "config.yaml"
        self.config.write_text(yaml.safe_dump(config))
        self.process: subprocess.Popen | None = None

    def __enter__(self) -> LiteLLM:
        env = {
            **os.environ,
            "LITELLM_TELEMETRY_DISABLED": "true",
            "LITELLM_LOCAL_MODEL_COST_MAP": "True",
            "LITELLM_MASTER_KEY": self.master_key,
            "LITELLM_LOG": "ERROR",
        }
        command = [str(VENV / "bin" / "litellm"), "--config", str(self.config), "--host", "127.0.0.1"]
        command += ["--port", str(self.port), "--num_workers", "1"]
        self.log = open(self.workdir / "litellm.log", "wb")  # closed in __exit__
        self.process = process = subprocess.Popen(
            command, env=env, stdout=self.log, stderr=subprocess.STDOUT, cwd=self.workdir
        )
        try:
            wait_until(
                lambda: process.poll() is not None or port_open(self.port),
                STARTUP_SECONDS,
                "LiteLLM's proxy to listen",
                interval=0.5,
            )
        except TimeoutError:
            self.__exit__()
            raise
        if process.poll() is not None:
            raise RuntimeError(f"litellm exited; its log is {self.workdir / 'litellm.log'}")
        return self

    def __exit__(self, *exc) -> None:
        if self.process and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)
        self.log.close()

    @property
    def pid(self) -> int:
        if self.process is None:
            raise RuntimeError("LiteLLM is started by entering its `with`")
        return self.process.pid
