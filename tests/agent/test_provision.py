"""Engines installed by the agent: real cmake, g++, venv and pip on small stand-ins for llama.cpp and vLLM.

The stand-in llama.cpp is a one-file C++ `llama-server` packed like a llama-cpp-python
sdist (vendor/llama.cpp) and put in the download cache, so the build runs for real
but in seconds and without the network; the real build is tests/test_engine_llama_cpp.py's.
"""

from __future__ import annotations

import platform
import subprocess
import sys
import time

import pytest

from agent.provision import Provisioner, Want
from devstack.polling import wait_until
from tests.agent.stand_ins import BROKEN, CMAKE, seed_sdist
from tests.agent.test_runner import group_members


class Recorder(Provisioner):
    """A provisioner that also keeps every state it passed through, with the time."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.history: list[tuple[float, str, str]] = []

    def _set(self, install, state, detail):
        self.history.append((time.monotonic(), state, detail))
        super()._set(install, state, detail)


def only(provisioner: Provisioner):
    (entry,) = provisioner.entries()
    return entry


def test_llama_cpp_is_built_once_into_the_cache_and_installed_per_agent(tmp_path):
    cache = tmp_path / "cache"
    seed_sdist(cache, "9.9.9")
    first = Recorder(tmp_path / "a" / "engines", cache=cache)
    first.want([Want("llama.cpp", "9.9.9")])
    wait_until(lambda: only(first).state != "installing", 120, "the build to end")
    entry = only(first)
    assert (entry.engine, entry.version, entry.variant, entry.state) == ("llama.cpp", "9.9.9", "cpu", "ready"), entry
    # The detail moved through the steps while it built.
    details = [detail for _, state, detail in first.history if state == "installing"]
    assert details[0] == "unpacking the llama.cpp source"
    assert "configuring (cmake)" in details and "building llama-server" in details
    assert any(d.startswith("building llama-server: ") and d.endswith(" %") for d in details)
    installed = first.ready("llama.cpp")
    assert installed == tmp_path / "a" / "engines" / "llama.cpp" / "9.9.9-cpu" / "bin"
    done = subprocess.run([installed / "llama-server", "--version"], capture_output=True, text=True, timeout=10)
    assert done.stderr == "version: 9 (stand-in)\n"
    assert (cache / "llama.cpp" / "9.9.9-cpu" / "bin" / "llama-server").is_file()
    assert not (cache / "llama.cpp" / "9.9.9-cpu.building").exists()

    # A second agent on the machine takes the build from the cache.
    second = Recorder(tmp_path / "b" / "engines", cache=cache)
    second.want([Want("llama.cpp", "9.9.9", "cpu")])
    wait_until(lambda: only(second).state == "ready", 30, "the second install")
    assert [d for _, s, d in second.history if s == "installing"] == ["installing from the cache"]
    assert (tmp_path / "b" / "engines" / "llama.cpp" / "9.9.9-cpu" / "bin" / "llama-server").is_file()


# Configures only when told not to build for this CPU (-march=native compiles ggml's AMX backend,
# which crashes llama-server on Sapphire Rapids).
NOT_NATIVE = CMAKE + (
    'if(NOT GGML_NATIVE STREQUAL "OFF")\n  message(FATAL_ERROR "GGML_NATIVE is ${GGML_NATIVE}")\nendif()\n'
)


@pytest.mark.skipif(platform.machine() != "x86_64", reason="the portable build is x86's")
def test_a_build_the_cache_holds_from_another_recipe_is_built_again_portably(tmp_path):
    cache = tmp_path / "cache"
    seed_sdist(cache, "9.9.8", cmake=NOT_NATIVE)
    # What an earlier agent left: a native build, made before builds kept their recipe.
    old = cache / "llama.cpp" / "9.9.8-cpu" / "bin" / "llama-server"
    old.parent.mkdir(parents=True)
    old.write_text("#!/bin/sh\necho old native build >&2\n")
    old.chmod(0o755)
    provisioner = Recorder(tmp_path / "engines", cache=cache)
    provisioner.want([Want("llama.cpp", "9.9.8")])
    wait_until(lambda: only(provisioner).state != "installing", 120, "the build to end")
    assert only(provisioner).state == "ready", only(provisioner).detail
    assert "configuring (cmake)" in [detail for _, _, detail in provisioner.history]
    installed = provisioner.ready("llama.cpp") / "llama-server"
    done = subprocess.run([installed, "--version"], capture_output=True, text=True, timeout=10)
    assert done.stderr == "version: 9 (stand-in)\n"


def test_a_failed_build_reports_the_log_tail_and_is_retried_with_growing_delays(tmp_path):
    cache = tmp_path / "cache"
    seed_sdist(cache, "6.6.6", cmake=BROKEN)
    provisioner = Recorder(tmp_path / "engines", cache=cache, backoff_base=0.3, backoff_cap=60)
    provisioner.want([Want("llama.cpp", "6.6.6")])
    wait_until(lambda: sum(1 for _, s, _ in provisioner.history if s == "failed") >= 3, 120, "three failures")
    entry = only(provisioner)
    assert entry.state in ("failed", "installing")
    failed = [(at, detail) for at, state, detail in provisioner.history if state == "failed"]
    assert failed[0][1].startswith("configuring (cmake): exit 1")
    assert "broken on purpose" in failed[0][1]
    # Each retry starts after the failure's delay, and the delay doubles: 0.3 s, then 0.6 s.
    retries = [
        next(at for at, state, _ in provisioner.history if state == "installing" and at > failed_at) - failed_at
        for failed_at, _ in failed[:2]
    ]
    assert 0.3 <= retries[0] < 0.6 <= retries[1] < 1.2, retries
    provisioner.stop()
    log = (tmp_path / "engines" / "logs" / "llama.cpp-6.6.6-cpu.log").read_text()
    assert "broken on purpose" in log and "$ cmake -S" in log


@pytest.mark.parametrize(
    ("want", "reason"),
    [
        (Want("llama.cpp", "9.9.9", "cuda"), "cuda: this node has no GPU"),
        (Want("llama.cpp", "9.9.9", "rocm"), "llama.cpp has no variant 'rocm' (known: cpu, cuda)"),
        (Want("vllm", "0.11.0"), "cuda: this node has no GPU"),
        (Want("tgi", "3.0"), "llmgw cannot install tgi; point the agent's engines at a binary"),
    ],
)
def test_what_cannot_run_here_is_unsupported_and_not_retried(tmp_path, want, reason):
    provisioner = Recorder(tmp_path / "engines", cache=tmp_path / "cache", backoff_base=0.01)
    provisioner.want([want])
    wait_until(lambda: only(provisioner).state != "installing", 10, "a verdict")
    assert (only(provisioner).state, only(provisioner).detail) == ("unsupported", reason)
    assert [s for _, s, _ in provisioner.history].count("unsupported") == 1


def test_an_operator_binary_is_ready_with_the_version_it_prints(tmp_path):
    binary = tmp_path / "bin" / "llama-server"
    binary.parent.mkdir()
    binary.write_text("#!/bin/sh\necho 'version: 4153 (abc)' >&2\n")
    binary.chmod(0o755)
    provisioner = Provisioner(tmp_path / "engines", operator_binaries={"llama.cpp": [str(binary)]})
    provisioner.want([Want("llama.cpp")])
    wait_until(lambda: only(provisioner).state == "ready", 10, "the probe")
    assert (only(provisioner).version, provisioner.ready("llama.cpp")) == ("4153 (abc)", binary.parent)


def test_a_missing_operator_binary_fails(tmp_path):
    provisioner = Provisioner(tmp_path / "engines", operator_binaries={"llama.cpp": [str(tmp_path / "nope")]})
    provisioner.want([Want("llama.cpp")])
    wait_until(lambda: only(provisioner).state == "failed", 10, "the probe")
    assert only(provisioner).detail == f"{tmp_path / 'nope'}: not installed"


STAND_IN = """
[build-system]
requires = ["setuptools>=61"]
build-backend = "setuptools.build_meta"

[project]
name = "vllm"
version = "0.0.1"

[project.scripts]
vllm = "vllm_stand_in:main"
"""


@pytest.mark.slow
def test_a_python_engine_gets_a_virtualenv_of_its_own_with_its_pinned_version(tmp_path):
    # A local package named like the engine, built here, and pip pointed at it (no network).
    source = tmp_path / "stand-in"
    source.mkdir()
    (source / "pyproject.toml").write_text(STAND_IN)
    (source / "vllm_stand_in.py").write_text("def main():\n    print('stand-in vllm 0.0.1')\n")
    wheels = tmp_path / "wheels"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--quiet",
            "--no-build-isolation",
            "--no-deps",
            str(source),
            "-w",
            wheels,
        ],
        check=True,
        timeout=120,
    )
    env = {"PIP_NO_INDEX": "1", "PIP_FIND_LINKS": str(wheels)}
    provisioner = Recorder(tmp_path / "engines", env=env)
    provisioner.want([Want("vllm", "0.0.1", "cpu")])
    wait_until(lambda: only(provisioner).state != "installing", 180, "the install")
    assert (only(provisioner).state, only(provisioner).version) == ("ready", "0.0.1"), only(provisioner).detail
    details = [d for _, s, d in provisioner.history if s == "installing"]
    assert "creating the virtualenv" in details and "installing vllm==0.0.1" in details
    bin_dir = provisioner.ready("vllm")
    assert bin_dir == tmp_path / "engines" / "vllm" / "0.0.1-cpu" / "bin"
    assert subprocess.run([bin_dir / "vllm"], capture_output=True, text=True).stdout == "stand-in vllm 0.0.1\n"

    # A version pip cannot find fails with pip's own words.
    provisioner.want([Want("vllm", "0.0.2", "cpu")])
    wait_until(lambda: only(provisioner).state == "failed", 180, "the failure")
    assert "installing vllm==0.0.2: exit 1" in only(provisioner).detail
    assert "No matching distribution found for vllm==0.0.2" in only(provisioner).detail
    provisioner.stop()


HANGING = "cmake_minimum_required(VERSION 3.14)\nproject(llama.cpp CXX)\nexecute_process(COMMAND sleep 60)\n"


def test_stopping_ends_the_build_and_every_process_it_started(tmp_path):
    seed_sdist(tmp_path / "cache", "7.7.7", cmake=HANGING)
    provisioner = Provisioner(tmp_path / "engines", cache=tmp_path / "cache")
    provisioner.want([Want("llama.cpp", "7.7.7")])
    wait_until(lambda: only(provisioner).detail == "configuring (cmake)", 60, "the configure step")
    (install,) = provisioner.installs.values()
    wait_until(lambda: install.context.process is not None, 10, "cmake to start")
    group = install.context.process.pid
    wait_until(lambda: len(group_members(group)) >= 2, 10, "cmake to start sleep")
    provisioner.stop()
    wait_until(lambda: group_members(group) == [], 10, "the build's group to end")
