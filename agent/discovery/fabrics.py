"""Fabric attachments: operator-named, with the rate of the slowest active port of their adapters."""

from __future__ import annotations

import logging
from pathlib import Path

from agent import protocol
from agent.config import FabricConfig

log = logging.getLogger("agent.discovery")


class MissingAdapter(Exception):
    """A configured adapter that is not in /sys/class/infiniband: the config names hardware this node lacks."""


def read_fabrics(fabrics: list[FabricConfig], sys_root: Path, strict: bool = False) -> list[protocol.Fabric]:
    """`strict` (at start-up) raises MissingAdapter; afterwards a vanished adapter is a warning and rate 0."""
    result = []
    for fabric in fabrics:
        rates = []
        for hca in fabric.hcas:
            ports = sys_root / "class" / "infiniband" / hca / "ports"
            if not ports.is_dir():
                message = f"fabrics: adapter {hca!r} of fabric {fabric.name!r} is not in {ports.parent.parent}"
                if strict:
                    raise MissingAdapter(message)
                log.warning("%s", message)
                continue
            rates.extend(_active_rates(ports))
        measured = min(rates) if rates else 0
        rate = fabric.rate_gbps if fabric.rate_gbps is not None else measured
        result.append(protocol.Fabric(name=fabric.name, hcas=list(fabric.hcas), rate_gbps=rate))
    return result


def _active_rates(ports: Path) -> list[int]:
    rates = []
    for port in sorted(ports.iterdir()):
        try:
            state = (port / "state").read_text()
            rate = (port / "rate").read_text()
        except OSError:
            continue
        # state reads like "4: ACTIVE", rate like "100 Gb/sec (4X EDR)".
        if "ACTIVE" not in state.upper().split(":")[-1]:
            continue
        try:
            rates.append(int(float(rate.split()[0])))
        except (ValueError, IndexError):
            log.warning("skipping malformed %s: %r", port / "rate", rate[:80])
    return rates
