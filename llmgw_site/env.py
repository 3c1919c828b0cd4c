"""Strict readers for settings that come from the environment.

A typo in a deployment's environment should stop the process at start with the
variable's name, not run with a silent default. Every secret may also be given
as `<NAME>_FILE`, a path whose contents are the value (for Docker and systemd
credentials).
"""

from __future__ import annotations

import ipaddress
import os
from pathlib import Path
from typing import overload


class EnvError(Exception):
    """A variable is set to something its reader does not accept."""


@overload
def env_str(name: str, default: str) -> str: ...
@overload
def env_str(name: str, default: None = None) -> str | None: ...
def env_str(name: str, default: str | None = None) -> str | None:
    file_path = os.environ.get(f"{name}_FILE")
    if file_path:
        try:
            return Path(file_path).read_text().strip()
        except OSError as exc:
            raise EnvError(f"{name}_FILE: cannot read {file_path}: {exc.strerror}") from exc
    return os.environ.get(name, default)


def env_bool(name: str, default: bool) -> bool:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    lowered = raw.strip().lower()
    if lowered == "true":
        return True
    if lowered == "false":
        return False
    raise EnvError(f"{name} must be true or false, not {raw!r}")


def env_int(name: str, default: int, minimum: int | None = None) -> int:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise EnvError(f"{name} must be a whole number, not {raw!r}") from None
    if minimum is not None and value < minimum:
        raise EnvError(f"{name} must be at least {minimum}, not {value}")
    return value


def env_float(name: str, default: float, minimum: float = 0.0, maximum: float | None = None) -> float:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = float(raw)
    except ValueError:
        raise EnvError(f"{name} must be a number, not {raw!r}") from None
    if not value >= minimum or value == float("inf"):
        raise EnvError(f"{name} must be a finite number of at least {minimum}, not {raw!r}")
    if maximum is not None and value > maximum:
        raise EnvError(f"{name} must be at most {maximum}, not {raw!r}")
    return value


def env_list(name: str, default: list[str]) -> list[str]:
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    return [item.strip() for item in raw.split(",") if item.strip()]


def env_networks(name: str) -> tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...]:
    """A comma-separated list of CIDR networks (`10.0.0.0/8, fd00::/8`); empty by default."""
    networks = []
    for item in env_list(name, []):
        try:
            networks.append(ipaddress.ip_network(item))
        except ValueError:
            raise EnvError(f"{name} must list networks such as 10.0.0.0/8, not {item!r}") from None
    return tuple(networks)
