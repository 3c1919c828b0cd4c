"""Python engines (vLLM, SGLang): the pinned version `pip install`ed into a virtualenv of its own.

One virtualenv per engine, version and variant, so two versions never share
dependencies and an engine never shares the agent's. pip reads PIP_INDEX_URL,
PIP_EXTRA_INDEX_URL, PIP_FIND_LINKS and the rest from the agent's `env`, which is how
an operator points it at a mirror, at CPU wheels, or (in the tests) at a local wheel.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

from agent.provision.steps import Context, InstallError, Unsupported, install_home

# cuda is what PyPI's wheels are built for; cpu needs the operator's index of CPU wheels.
VARIANTS = ("cuda", "cpu")


def install(engine: str, package: str, version: str, variant: str, ctx: Context) -> Path:
    """Create the virtualenv and install `package`; returns its bin directory, which holds the engine's programs."""
    if variant not in VARIANTS:
        raise Unsupported(f"{engine} has no variant {variant!r} (known: {', '.join(VARIANTS)})")
    if variant == "cuda" and not ctx.gpus:
        raise Unsupported("cuda: this node has no GPU")
    home = install_home(ctx.home, engine, version, variant)
    # Written last: a virtualenv without it was interrupted and is made again. (Built in
    # place, as a virtualenv's scripts hold its path and cannot be moved once made.)
    done = home / ".installed"
    if done.exists():
        return home / "bin"
    shutil.rmtree(home, ignore_errors=True)
    home.parent.mkdir(parents=True, exist_ok=True)
    ctx.run("creating the virtualenv", [sys.executable, "-m", "venv", str(home)])
    python = str(home / "bin" / "python")
    ctx.run(
        f"installing {package}=={version}",
        [python, "-m", "pip", "install", "--disable-pip-version-check", f"{package}=={version}"],
        watch=_pip_step,
    )
    found = ctx.run(
        "checking the installed version",
        [python, "-c", f"import importlib.metadata as m; print(m.version({package!r}))"],
    ).strip()
    if found != version:
        raise InstallError(f"checking the installed version: pip installed {package} {found}, not {version}")
    done.write_text(f"{package}=={version}\n")
    return home / "bin"


def _pip_step(line: str) -> str | None:
    # pip's own progress lines name the package it is on: "Collecting torch==…", "Installing collected packages".
    for prefix in ("Collecting ", "Downloading ", "Building wheel", "Installing collected packages"):
        if line.startswith(prefix):
            return line.strip()[:120]
    return None
