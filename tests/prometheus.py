"""A real Prometheus for tests, and a tiny exposition server for it to scrape.

The exposition server lets a test decide exactly what Prometheus records, so a
chart test can check the numbers it draws against the numbers it fed.
"""

from __future__ import annotations

import shutil
import subprocess
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import requests

from devstack.polling import wait_until
from devstack.ports import free_port, port_open


class ExpositionServer:
    """Serves `text` at /metrics in the Prometheus text format; the test may change it any time."""

    def __init__(self, text: str = ""):
        self.text = text
        self.scrapes = 0
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):
                body = owner.text.encode()
                owner.scrapes += 1
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def start(self) -> ExpositionServer:
        self.thread.start()
        return self

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class PrometheusServer:
    """Debian's prometheus on a free port, scraping one target every `interval` seconds."""

    def __init__(
        self,
        workdir: Path,
        target: str,
        interval: str = "1s",
        metrics_path: str = "/metrics",
        rules: Path | None = None,
    ):
        binary = shutil.which("prometheus")
        if binary is None:
            raise RuntimeError("prometheus is not installed: apt-get install prometheus")
        self.binary = binary
        self.workdir = workdir
        self.port = free_port()
        self.target = target
        self.interval = interval
        self.metrics_path = metrics_path
        # A rules file to evaluate every `interval`, so an alert without `for:` fires within a second or two.
        self.rules = rules
        self.process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> PrometheusServer:
        self.workdir.mkdir(parents=True, exist_ok=True)
        config = self.workdir / "prometheus.yml"
        config.write_text(self.config_text())
        self.process = subprocess.Popen(
            [
                self.binary,
                f"--config.file={config}",
                f"--storage.tsdb.path={self.workdir / 'data'}",
                f"--web.listen-address=127.0.0.1:{self.port}",
                "--log.level=warn",
            ],
            stdout=subprocess.DEVNULL,
            stderr=open(self.workdir / "prometheus.log", "wb"),  # noqa: SIM115 (the child keeps it)
        )
        wait_until(self.ready, 30, f"prometheus on port {self.port}")
        return self

    def config_text(self) -> str:
        """Its prometheus.yml; a test may give another (a job as deploy/prometheus.yml has it)."""
        return (
            "global:\n"
            f"  scrape_interval: {self.interval}\n"
            f"  evaluation_interval: {self.interval}\n"
            + (f"rule_files: ['{self.rules}']\n" if self.rules else "")
            + "scrape_configs:\n"
            "  - job_name: llmgw\n"
            f"    metrics_path: {self.metrics_path}\n"
            "    static_configs:\n"
            f"      - targets: ['{self.target}']\n"
        )

    def ready(self) -> bool:
        if self.process.poll() is not None:
            raise RuntimeError(f"prometheus exited with {self.process.returncode}; see {self.workdir}/prometheus.log")
        if not port_open(self.port):
            return False
        try:
            return requests.get(f"{self.url}/-/ready", timeout=1).status_code == 200
        except requests.RequestException:
            return False

    def samples(self, selector: str) -> int:
        """How many samples of the series `selector` Prometheus holds over the last ten minutes."""
        response = requests.get(f"{self.url}/api/v1/query", params={"query": f"count_over_time({selector}[10m])"})
        result = response.json()["data"]["result"]
        return int(float(result[0]["value"][1])) if result else 0

    def stop(self) -> None:
        if self.process and self.process.poll() is None:
            self.process.terminate()
            self.process.wait(15)
        wait_until(lambda: not port_open(self.port), 10, f"prometheus on port {self.port} to stop")
