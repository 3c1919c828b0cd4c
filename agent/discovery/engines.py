"""Engine versions: `<command> --version`, with a timeout, or "not installed"."""

from __future__ import annotations

import subprocess

from agent import protocol

NOT_INSTALLED = "not installed"


def probe(commands: dict[str, list[str]], timeout: float = 20.0) -> dict[str, str]:
    return {name: probe_one(command, timeout) for name, command in list(commands.items())[: protocol.MAX_ENGINES]}


def probe_one(command: list[str], timeout: float) -> str:
    try:
        done = subprocess.run(
            [*command, "--version"], capture_output=True, timeout=timeout, stdin=subprocess.DEVNULL, check=False
        )
    except (FileNotFoundError, PermissionError, NotADirectoryError):
        return NOT_INSTALLED
    except subprocess.TimeoutExpired:
        return f"unknown (no answer to --version in {timeout:g} s)"
    except OSError as exc:
        return f"unknown ({exc.strerror})"
    for stream in (done.stdout, done.stderr):
        for line in stream.decode(errors="replace").splitlines():
            line = line.strip()
            if line:
                # llama-server says "version: 4153 (abc)"; vllm says just "0.6.3".
                version = line.removeprefix("version:").strip()
                if done.returncode != 0:
                    version = f"unknown (exit {done.returncode}: {version})"
                return protocol.clip(version)
    return f"unknown (exit {done.returncode}, no output)"
