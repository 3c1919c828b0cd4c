"""Engines installed by the agent: what the control plane wants, installed in the background, reported each beat.

Each wanted (engine, version, variant) gets a thread that installs it into
`<state_dir>/engines/<engine>/<version>-<variant>/`, reporting where it stands as an
`EngineInstall` (installing with the step under way, ready, failed with the end of
the log, unsupported). Heartbeats only read that state, so a 30-minute build never
delays one. A failed install is tried again after a delay that doubles each time, up
to a cap; an unsupported one is not tried again until it is wanted anew. An engine
the operator points at (the config's `engines`) is not installed but probed, and
reported ready with the version it prints.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from agent import engine_templates, protocol
from agent.discovery.engines import NOT_INSTALLED, probe_one
from agent.provision import llama_cpp, pip_venv
from agent.provision.steps import Context, InstallError, Unsupported, default_cache

log = logging.getLogger("agent.provision")

# What a want without a variant means.
DEFAULT_VARIANTS = {"llama.cpp": "cpu", "vllm": "cuda", "sglang": "cuda"}
INSTALLABLE = tuple(DEFAULT_VARIANTS)


@dataclass(frozen=True)
class Want:
    engine: str
    version: str = ""
    variant: str = ""

    def resolved(self) -> Want:
        """The version and variant filled in: the pinned version, the engine's usual variant."""
        return Want(
            self.engine,
            self.version or engine_templates.PINNED.get(self.engine, ""),
            self.variant or DEFAULT_VARIANTS.get(self.engine, ""),
        )


@dataclass
class _Install:
    want: Want
    stop: threading.Event
    state: protocol.InstallState = "installing"
    detail: str = "queued"
    version: str = ""
    bin_dir: Path | None = None
    failures: int = 0
    context: Context | None = None


class Provisioner:
    def __init__(
        self,
        home: Path,
        cache: Path | None = None,
        env: dict[str, str] | None = None,
        operator_binaries: dict[str, list[str]] | None = None,
        gpus: Callable[[], int] = lambda: 0,
        backoff_base: float = 60.0,
        backoff_cap: float = 3600.0,
    ):
        self.home = Path(home)
        self.cache = Path(cache) if cache else default_cache()
        self.env = dict(env or {})
        self.operator_binaries = dict(operator_binaries or {})
        self.gpus = gpus
        self.backoff_base = backoff_base
        self.backoff_cap = backoff_cap
        self.lock = threading.Lock()
        self.installs: dict[Want, _Install] = {}

    def want(self, wants: list[Want]) -> None:
        """Install exactly these (more are ignored past the protocol's bound); forget the others."""
        wanted = {w.resolved() for w in wants[: protocol.MAX_ENGINES]}
        with self.lock:
            for want in list(self.installs):
                if want not in wanted:
                    self._cancel(self.installs.pop(want))
            for want in wanted - set(self.installs):
                install = self.installs[want] = _Install(want, threading.Event())
                threading.Thread(target=self._work, args=(install,), name=f"install {want.engine}", daemon=True).start()

    def entries(self) -> list[protocol.EngineInstall]:
        with self.lock:
            return [
                protocol.EngineInstall(
                    engine=i.want.engine[: protocol.MAX_TEXT],
                    version=(i.version or i.want.version)[: protocol.MAX_TEXT],
                    variant=i.want.variant[: protocol.MAX_TEXT],
                    state=i.state,
                    detail=i.detail[: protocol.MAX_DETAIL],
                )
                for i in sorted(self.installs.values(), key=lambda i: (i.want.engine, i.want.version))
            ]

    def wanted(self, engine: str) -> bool:
        with self.lock:
            return any(w.engine == engine for w in self.installs)

    def ready(self, engine: str) -> Path | None:
        """The bin directory of a ready install of `engine` (the operator's binary's directory), else None."""
        with self.lock:
            for install in self.installs.values():
                if install.want.engine == engine and install.state == "ready":
                    return install.bin_dir
        return None

    def stop(self) -> None:
        with self.lock:
            for install in self.installs.values():
                self._cancel(install)

    # -- one install's thread ------------------------------------------------------------------

    def _work(self, install: _Install) -> None:
        want = install.want
        while not install.stop.is_set():
            try:
                install.bin_dir, install.version = self._attempt(install)
            except Unsupported as exc:
                self._set(install, "unsupported", str(exc))
                log.warning("engine %s %s (%s) unsupported here: %s", want.engine, want.version, want.variant, exc)
                return
            except Exception as exc:
                # InstallError carries the log's tail; anything else is a surprise worth its traceback.
                if not isinstance(exc, InstallError):
                    log.exception("installing %s %s failed unexpectedly", want.engine, want.version)
                install.failures += 1
                delay = min(self.backoff_cap, self.backoff_base * 2 ** min(install.failures - 1, 30))
                self._set(install, "failed", f"{exc}"[: protocol.MAX_DETAIL])
                log.warning("installing %s %s failed; trying again in %.0f s", want.engine, want.version, delay)
                if install.stop.wait(delay):
                    return
                continue
            self._set(install, "ready", "")
            log.info("engine %s %s (%s) ready in %s", want.engine, install.version, want.variant, install.bin_dir)
            return

    def _attempt(self, install: _Install) -> tuple[Path | None, str]:
        want = install.want
        if want.engine in self.operator_binaries:
            return self._probe(install, self.operator_binaries[want.engine])
        if want.engine not in INSTALLABLE:
            raise Unsupported(f"llmgw cannot install {want.engine}; point the agent's engines at a binary")
        safe = "".join(c if c.isalnum() or c in "._-+" else "_" for c in f"{want.version}-{want.variant}")
        context = Context(
            home=self.home,
            cache=self.cache,
            env=self.env,
            gpus=self.gpus(),
            progress=lambda detail: self._set(install, "installing", detail),
            log_path=self.home / "logs" / f"{want.engine}-{safe}.log",
        )
        install.context = context
        if install.stop.is_set():
            raise InstallError("stopped")
        if want.engine == "llama.cpp":
            return llama_cpp.install(want.version, want.variant, context), want.version
        return pip_venv.install(want.engine, want.version, want.variant, context), want.version

    def _probe(self, install: _Install, command: list[str]) -> tuple[Path | None, str]:
        self._set(install, "installing", f"asking {command[0]} --version")
        version = probe_one(command, timeout=20.0)
        if version == NOT_INSTALLED or version.startswith("unknown"):
            raise InstallError(f"{' '.join(command)}: {version}")
        # Shards find the operator's binary first on their PATH when it was given as a path.
        path = Path(command[0])
        return (path.parent if path.is_absolute() else None), version

    def _set(self, install: _Install, state: protocol.InstallState, detail: str) -> None:
        with self.lock:
            install.state, install.detail = state, detail

    def _cancel(self, install: _Install) -> None:
        install.stop.set()
        if install.context is not None:
            install.context.cancel()
