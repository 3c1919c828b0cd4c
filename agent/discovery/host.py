"""The operating system, kernel, processor and memory of the node."""

from __future__ import annotations

import os
import shlex
from pathlib import Path

from agent import procfs, protocol


def read_host(roots: procfs.Roots) -> protocol.Host:
    release = os_release(roots)
    cpuinfo = _read(roots.proc / "cpuinfo")
    model = ""
    cpus = 0
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        key = key.strip()
        if key == "processor":
            cpus += 1
        elif not model and key in ("model name", "Model", "Hardware", "cpu model"):
            model = value.strip()
    return protocol.Host(
        os=release.get("NAME", "")[: protocol.MAX_TEXT],
        os_version=release.get("VERSION_ID", release.get("VERSION", ""))[: protocol.MAX_TEXT],
        kernel=_read(roots.proc / "sys" / "kernel" / "osrelease").strip()[: protocol.MAX_TEXT],
        arch=os.uname().machine,
        cpu_model=model[: protocol.MAX_TEXT],
        cpus=cpus or os.cpu_count() or 0,
    )


def os_release(roots: procfs.Roots) -> dict[str, str]:
    values = {}
    for line in _read(roots.etc / "os-release").splitlines():
        key, sep, value = line.partition("=")
        if not sep or not key.strip().isidentifier():
            continue
        try:
            parts = shlex.split(value)
        except ValueError:
            continue
        values[key.strip()] = parts[0] if parts else ""
    return values


def memory_total(roots: procfs.Roots) -> int:
    return min(procfs.read_meminfo(roots.proc).get("MemTotal", 0), protocol.MAX_COUNT)


def _read(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return ""
