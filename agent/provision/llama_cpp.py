"""llama.cpp's `llama-server`, built from the llama.cpp vendored in a llama-cpp-python sdist.

Debian has no llama.cpp package, but PyPI has its source inside every llama-cpp-python
sdist. Only the server target is built (a few minutes instead of the whole tree), once
per version and variant in the shared cache; each agent then copies the binary into
its own engines directory, so clearing the cache never breaks a running node.
"""

from __future__ import annotations

import hashlib
import os
import platform
import re
import shutil
import sys
import tarfile
import tempfile
from pathlib import Path

from agent.provision.steps import Context, InstallError, Unsupported, install_home, locked

PACKAGE = "llama-cpp-python"
PROGRAM = "llama-server"
# Two jobs: the node's cores belong to its engines, and a build is done once per version.
JOBS = 2
FLAGS = [
    "-DCMAKE_BUILD_TYPE=Release",
    "-DLLAMA_CURL=OFF",
    # HTTPS is for downloading models, which the agent does itself.
    "-DLLAMA_OPENSSL=OFF",
    "-DLLAMA_BUILD_TESTS=OFF",
    "-DLLAMA_BUILD_EXAMPLES=OFF",
    "-DLLAMA_BUILD_SERVER=ON",
    # One self-contained binary, which can be copied without its libraries.
    "-DBUILD_SHARED_LIBS=OFF",
]
VARIANT_FLAGS = {"cpu": [], "cuda": ["-DGGML_CUDA=ON"]}
# On x86, not -march=native: on Sapphire Rapids it compiles ggml's AMX backend, whose matrix
# multiply crashes llama-server (SIGSEGV at its first inference, ggml-org/llama.cpp#20824; seen
# here in CI). Off, ggml builds for AVX2, FMA, F16C and BMI2 (x86-64-v3), which every x86 node of
# the last decade has, and one build in the cache serves every such node. Other CPUs keep native.
X86_FLAGS = ["-DGGML_NATIVE=OFF"]
# What a build in the cache was made with; a build made otherwise is made again.
RECIPE_FILE = "recipe"
_PERCENT = re.compile(r"^\[\s*(\d+)%\]")


def install(engine: str, version: str, variant: str, ctx: Context) -> Path:
    """Build (or take from the cache) and install; returns the directory holding `llama-server`."""
    if variant not in VARIANT_FLAGS:
        raise Unsupported(f"{engine} has no variant {variant!r} (known: {', '.join(VARIANT_FLAGS)})")
    if variant == "cuda" and not ctx.gpus:
        raise Unsupported("cuda: this node has no GPU")
    if variant == "cuda" and shutil.which("nvcc", path=ctx.env.get("PATH", os.environ.get("PATH"))) is None:
        raise Unsupported("cuda: no nvcc (the CUDA toolkit) on this node to build with")
    built = install_home(ctx.cache, engine, version, variant)
    with locked(built.with_name(built.name + ".lock")):
        if not _cached(built, variant):
            _build(_source(engine, version, ctx), built, variant, ctx)
    target = install_home(ctx.home, engine, version, variant) / "bin"
    target.mkdir(parents=True, exist_ok=True)
    ctx.progress("installing from the cache")
    staged = target / f".{PROGRAM}.new"
    shutil.copy2(built / "bin" / PROGRAM, staged)
    staged.replace(target / PROGRAM)
    return target


def _flags(variant: str) -> list[str]:
    machine = [*X86_FLAGS] if platform.machine().lower() in ("x86_64", "amd64") else []
    return [*FLAGS, *machine, *VARIANT_FLAGS[variant]]


def recipe(variant: str) -> str:
    """A digest of the build's flags, kept beside the binary it made."""
    return hashlib.sha256("\n".join(_flags(variant)).encode()).hexdigest()


def _cached(built: Path, variant: str) -> bool:
    stamp = built / RECIPE_FILE
    return (built / "bin" / PROGRAM).exists() and stamp.exists() and stamp.read_text() == recipe(variant)


def _source(engine: str, version: str, ctx: Context) -> Path:
    sources = ctx.cache / engine / "sources"
    sdist = sources / f"llama_cpp_python-{version}.tar.gz"
    if sdist.exists():
        return sdist
    sources.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=sources) as scratch:
        ctx.run(
            f"downloading {PACKAGE} {version}",
            [
                sys.executable, "-m", "pip", "download", "--disable-pip-version-check", "--no-binary", ":all:",
                "--no-deps", f"{PACKAGE}=={version}", "--dest", scratch,
            ],
        )  # fmt: skip
        (downloaded,) = Path(scratch).glob("*.tar.gz")
        downloaded.replace(sdist)
    return sdist


def _build(sdist: Path, built: Path, variant: str, ctx: Context) -> None:
    work = built.with_name(built.name + ".building")
    shutil.rmtree(work, ignore_errors=True)
    ctx.progress("unpacking the llama.cpp source")
    source = _unpack(sdist, work / "src")
    build = work / "build"
    ctx.run("configuring (cmake)", ["cmake", "-S", str(source), "-B", str(build), *_flags(variant)])
    ctx.run(
        f"building {PROGRAM}",
        ["cmake", "--build", str(build), "--target", PROGRAM, "-j", str(JOBS)],
        watch=lambda line: f"{m.group(1)} %" if (m := _PERCENT.match(line)) else None,
    )
    (work / "bin").mkdir()
    shutil.copy2(build / "bin" / PROGRAM, work / "bin" / PROGRAM)
    (work / RECIPE_FILE).write_text(recipe(variant))
    shutil.rmtree(work / "src")
    shutil.rmtree(build)
    shutil.rmtree(built, ignore_errors=True)
    work.replace(built)


def _unpack(sdist: Path, into: Path) -> Path:
    """Only vendor/llama.cpp: the Python binding around it is not needed."""
    with tarfile.open(sdist) as archive:
        members = [m for m in archive.getmembers() if "/vendor/llama.cpp/" in f"{m.name}/"]
        archive.extractall(into, members=members, filter="data")
    found = list(into.glob("*/vendor/llama.cpp"))
    if not found:
        raise InstallError(f"unpacking: {sdist.name} holds no vendor/llama.cpp")
    return found[0]
