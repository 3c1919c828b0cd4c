"""What the node is: host, memory, GPUs, storage, weights, fabrics and engine versions.

Discovery runs at start and then again now and then; the heartbeat carries the
inventory's hash, and the full inventory only when the hash changed or the control
plane asked for it.
"""

from __future__ import annotations

import hashlib
import logging
import socket
import time
from collections.abc import Set
from urllib.parse import urlparse

import msgspec

from agent import __version__, procfs, protocol
from agent.config import Config
from agent.discovery import engines, fabrics, gpus, host, storage

MissingAdapter = fabrics.MissingAdapter
log = logging.getLogger("agent.discovery")


class Discoverer:
    """Builds the inventory; engines are probed at most every `probe_every` seconds (a probe starts Python)."""

    def __init__(self, config: Config, roots: procfs.Roots = procfs.REAL, probe_every: float = 600.0):
        self.config = config
        self.roots = roots
        self.storage = storage.Storage(roots.proc)
        self.probe_every = probe_every
        self.engine_versions: dict[str, str] = {}
        self.probed_at: float | None = None

    def discover(self, own_pids: Set[int] = frozenset(), strict: bool = False) -> protocol.Inventory:
        """`strict` at start-up: a configured adapter that does not exist raises MissingAdapter."""
        fabric_list = fabrics.read_fabrics(self.config.fabrics, self.roots.sys, strict=strict)
        if self.probed_at is None or time.monotonic() - self.probed_at >= self.probe_every:
            self.engine_versions = engines.probe(self.config.engine_commands)
            self.probed_at = time.monotonic()
        filesystems, weights = self.storage.read(self.config.model_dirs)
        inventory = protocol.Inventory(
            hostname=socket.gethostname()[: protocol.MAX_TEXT],
            mgmt_addr=management_address(self.config.control_plane),
            labels=dict(self.config.labels),
            memory_total_bytes=host.memory_total(self.roots),
            host=host.read_host(self.roots),
            agent_version=__version__,
            engine_versions=dict(self.engine_versions),
            engines_probed=True,
            gpus=gpus.read_gpus(own_pids),
            filesystems=filesystems,
            weights=weights,
            weights_scanned=bool(self.config.model_dirs),
            fabrics=fabric_list,
        )
        return fit(inventory)


# The inventory's share of a heartbeat body; the rest of MAX_BODY_BYTES is room for load and shard statuses.
INVENTORY_BUDGET = protocol.MAX_BODY_BYTES * 3 // 4


def fit(inventory: protocol.Inventory, budget: int = INVENTORY_BUDGET) -> protocol.Inventory:
    """Drop weights from the end until the inventory fits its budget: a body the control plane
    refuses for its size would be refused on every beat, and the node would never report."""
    size = len(protocol.encode(inventory))
    if size <= budget:
        return inventory
    weights = inventory.weights
    keep = len(weights)
    while keep and size > budget:
        keep = keep * budget // size * 9 // 10
        size = len(protocol.encode(msgspec.structs.replace(inventory, weights=weights[:keep])))
    log.warning("inventory too large for a heartbeat: reporting %d of %d weights", keep, len(weights))
    return msgspec.structs.replace(inventory, weights=weights[:keep])


def inventory_hash(inventory: protocol.Inventory) -> str:
    # msgspec encodes struct fields in declaration order and dicts in insertion
    # order; sorting the keys makes the hash independent of the latter.
    canonical = msgspec.json.encode(msgspec.to_builtins(inventory), order="sorted")
    return hashlib.sha256(canonical).hexdigest()


def management_address(control_plane: str) -> str:
    """The local address this node uses to reach the control plane (a UDP connect sends nothing)."""
    url = urlparse(control_plane)
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
            sock.connect((url.hostname or "127.0.0.1", url.port or 80))
            address: str = sock.getsockname()[0]  # an AF_INET socket's name is (host, port)
            return address
    except OSError:
        return ""
