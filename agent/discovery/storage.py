"""Filesystems holding the model directories, and the weights inside them.

Both touch paths that may live on a network filesystem, and a hung NFS server makes
`stat` block forever. So each model directory is examined in a thread of its own
with a deadline; a directory whose last look never returned is not looked at again
until it does, so hung threads cannot pile up.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Collection
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from agent import protocol

log = logging.getLogger("agent.discovery")

SHARED_TYPES = frozenset({"nfs", "nfs4", "cifs", "smb3", "lustre", "gpfs", "beegfs", "cephfs", "glusterfs"})
MAX_DEPTH = 4
MAX_ENTRIES = 20_000
GiB = 2**30


def is_shared(fstype: str) -> bool:
    return fstype in SHARED_TYPES or fstype.startswith("fuse.")


@dataclass(frozen=True)
class Mount:
    point: str
    fstype: str


def read_mounts(proc: Path) -> list[Mount]:
    mounts: list[Mount] = []
    try:
        text = (proc / "self" / "mountinfo").read_text(errors="replace")
    except OSError as exc:
        log.warning("cannot read mounts: %s", exc)
        return mounts
    for line in text.splitlines():
        # "36 35 98:0 /root /mnt rw,noatime master:1 - ext4 /dev/sda1 rw": the type follows " - ".
        before, sep, after = line.partition(" - ")
        fields = before.split()
        if not sep or len(fields) < 5 or not after.split():
            log.warning("skipping malformed mountinfo line: %r", line[:120])
            continue
        mounts.append(Mount(_unescape(fields[4]), after.split()[0]))
    return mounts


def mount_of(path: str, mounts: list[Mount]) -> Mount | None:
    best = None
    for mount in mounts:
        prefix = mount.point.rstrip("/") + "/"
        if (path == mount.point or path.startswith(prefix)) and (best is None or len(mount.point) >= len(best.point)):
            best = mount
    return best


@dataclass
class Look:
    """What one model directory showed."""

    filesystem: protocol.Filesystem | None = None
    weights: list[protocol.Weights] = field(default_factory=list)


def look_at(model_dir: str, mounts: list[Mount], max_weights: int = protocol.MAX_WEIGHTS) -> Look:
    """The filesystem under `model_dir` and the weights within it. May block on a hung mount: call through Storage."""
    path = os.path.realpath(model_dir)
    if not os.path.isdir(path):
        log.warning("model directory %s does not exist", model_dir)
        return Look()
    mount = mount_of(path, mounts)
    stats = os.statvfs(path)
    filesystem = protocol.Filesystem(
        mount=(mount.point if mount else path)[: protocol.MAX_DETAIL],
        fstype=(mount.fstype if mount else "")[: protocol.MAX_TEXT],
        total_bytes=min(stats.f_blocks * stats.f_frsize, protocol.MAX_COUNT),
        # Whole GiB only: free space moves with every log line, and a moving figure
        # would change the inventory hash, and so resend the inventory, on every beat.
        free_bytes=min(stats.f_bavail * stats.f_frsize // GiB * GiB, protocol.MAX_COUNT),
        shared=bool(mount and is_shared(mount.fstype)),
    )
    return Look(filesystem, scan_weights(path, max_weights))


def scan_weights(root: str, limit: int = protocol.MAX_WEIGHTS) -> list[protocol.Weights]:
    """Model directories (config.json with *.safetensors or *.bin) and *.gguf files, bounded in depth and count."""
    found: list[protocol.Weights] = []
    visited = 0
    stack = [(root, 0)]
    while stack and len(found) < limit and visited < MAX_ENTRIES:
        directory, depth = stack.pop()
        try:
            with os.scandir(directory) as it:
                entries = list(it)
        except OSError as exc:
            log.warning("cannot list %s: %s", directory, exc.strerror)
            continue
        visited += len(entries)
        files = {e.name: e for e in entries if _is_file(e)}
        fmt = _model_format(files)
        if fmt:
            size = sum(_size(e) for e in files.values())
            found.append(protocol.Weights(path=directory[: protocol.MAX_DETAIL], size_bytes=size, format=fmt))
            continue
        for name, entry in sorted(files.items()):
            if name.endswith(".gguf") and len(found) < limit:
                path = entry.path[: protocol.MAX_DETAIL]
                found.append(protocol.Weights(path=path, size_bytes=_size(entry), format="gguf"))
        if depth < MAX_DEPTH:
            stack.extend((e.path, depth + 1) for e in sorted(entries, key=lambda e: e.name, reverse=True) if _is_dir(e))
    return sorted(found, key=lambda w: w.path)


def _model_format(files: Collection[str]) -> Literal["safetensors", "bin", ""]:
    if "config.json" not in files:
        return ""
    if any(name.endswith(".safetensors") for name in files):
        return "safetensors"
    if any(name.endswith(".bin") for name in files):
        return "bin"
    return ""


def _is_file(entry: os.DirEntry[str]) -> bool:
    try:
        return entry.is_file()
    except OSError:
        return False


def _is_dir(entry: os.DirEntry[str]) -> bool:
    try:
        return entry.is_dir(follow_symlinks=False)
    except OSError:
        return False


def _size(entry: os.DirEntry[str]) -> int:
    try:
        return min(entry.stat().st_size, protocol.MAX_COUNT)
    except OSError:
        return 0


def _unescape(field_: str) -> str:
    # mountinfo writes space, tab, newline and backslash as octal escapes.
    for code, char in (("\\040", " "), ("\\011", "\t"), ("\\012", "\n"), ("\\134", "\\")):
        field_ = field_.replace(code, char)
    return field_


class Storage:
    """Looks at each model directory under a deadline, remembering the ones that hung."""

    def __init__(self, proc: Path, timeout: float = 10.0):
        self.proc = proc
        self.timeout = timeout
        self.hung: dict[str, threading.Thread] = {}

    def read(self, model_dirs: list[str]) -> tuple[list[protocol.Filesystem], list[protocol.Weights]]:
        mounts = read_mounts(self.proc)
        filesystems: dict[str, protocol.Filesystem] = {}
        weights: list[protocol.Weights] = []
        for model_dir in model_dirs:
            look = self._look_with_deadline(model_dir, mounts, protocol.MAX_WEIGHTS - len(weights))
            if look is None:
                continue
            if look.filesystem and look.filesystem.mount not in filesystems:
                filesystems[look.filesystem.mount] = look.filesystem
            weights.extend(look.weights)
        return list(filesystems.values())[: protocol.MAX_FILESYSTEMS], weights[: protocol.MAX_WEIGHTS]

    def _look_with_deadline(self, model_dir: str, mounts: list[Mount], limit: int) -> Look | None:
        previous = self.hung.get(model_dir)
        if previous is not None:
            if previous.is_alive():
                log.warning("model directory %s is still not answering; skipped", model_dir)
                return None
            del self.hung[model_dir]
        result: list[Look] = []

        def work() -> None:
            try:
                result.append(look_at(model_dir, mounts, limit))
            except OSError as exc:
                log.warning("cannot examine model directory %s: %s", model_dir, exc.strerror or exc)

        thread = threading.Thread(target=work, name=f"storage:{model_dir}", daemon=True)
        thread.start()
        thread.join(self.timeout)
        if thread.is_alive():
            log.warning("model directory %s did not answer within %g s (hung mount?); skipped", model_dir, self.timeout)
            self.hung[model_dir] = thread
            return None
        return result[0] if result else None
