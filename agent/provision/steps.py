"""Running an install's commands: each step logged to the install's log, its progress reported as it goes."""

from __future__ import annotations

import contextlib
import fcntl
import os
import signal
import subprocess
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from agent import admission
from agent.details import with_last_lines

Progress = Callable[[str], None]


class InstallError(Exception):
    """A step failed; the message names the step and ends with the last lines of its output."""


class Unsupported(Exception):
    """The variant cannot run on this node (cuda without GPUs); retrying would not help."""


def install_home(root: Path, engine: str, version: str, variant: str) -> Path:
    """`<root>/<engine>/<version>-<variant>`, refused unless version and variant are plain words.

    Checked here, where the path is built, as well as where a want arrives: what this
    returns is removed and made again, so it must never point outside `root`.
    """
    for value in (version, variant):
        if not admission.plain_word(value):
            raise Unsupported(f"{value!r} is not a plain word (letters, digits, . _ + -)")
    home = root / engine / f"{version}-{variant}"
    if home.parent.parent != root or not admission.inside(str(home), [str(root)]):
        raise Unsupported(f"{engine!r} {version!r} {variant!r} would install outside {root}")
    return home


@dataclass
class Context:
    """Where an install puts things, and how it reports. One per attempt."""

    home: Path  # the agent's engines directory: <state_dir>/engines
    cache: Path  # shared by every agent and test on the machine
    env: dict[str, str]
    gpus: int
    progress: Progress
    log_path: Path
    tail_lines: int = 12
    cancelled: threading.Event = field(default_factory=threading.Event)
    process: subprocess.Popen[str] | None = None

    def run(self, step: str, argv: list[str], watch: Callable[[str], str | None] | None = None) -> str:
        """Run one command, its output appended to the log; `watch` turns an output line into a new detail.

        Returns the output (its last lines only: a build's output is long)."""
        self.progress(step)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "a") as log:
            log.write(f"$ {' '.join(argv)}\n")
            log.flush()
            try:
                process = subprocess.Popen(
                    argv,
                    env={**os.environ, **self.env},
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.STDOUT,
                    text=True,
                    errors="replace",
                    # Its own group, so that stopping it stops make and every compiler it started.
                    start_new_session=True,
                )
            except OSError as exc:
                raise InstallError(f"{step}: cannot run {argv[0]}: {exc.strerror}") from None
            self.process = process
            recent: list[str] = []
            assert process.stdout is not None  # stdout=PIPE
            for line in process.stdout:
                log.write(line)
                recent = [*recent[-(self.tail_lines - 1) :], line.rstrip()]
                detail = watch(line) if watch else None
                if detail:
                    self.progress(f"{step}: {detail}")
            code = process.wait()
            self.process = None
        if self.cancelled.is_set():
            raise InstallError(f"{step}: stopped with the agent")
        if code != 0:
            raise InstallError(with_last_lines(f"{step}: exit {code}", recent))
        return "\n".join(recent)

    def cancel(self) -> None:
        """Stop the step under way (the agent is stopping); the install then fails, to be retried next time."""
        self.cancelled.set()
        process = self.process
        if process is not None:
            with contextlib.suppress(OSError):
                os.killpg(process.pid, signal.SIGTERM)


@contextlib.contextmanager
def locked(path: Path) -> Iterator[None]:
    """One builder at a time for a cache entry, across agents and tests on the machine."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def default_cache() -> Path:
    """Under the user's cache directory, so a second agent, a test or `make run` reuses a build."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "llmgw" / "engines"
