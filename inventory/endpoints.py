"""Where others reach a node, and a placed shard's engine on it: the one rule for a node's address.

A node must not choose where others connect: its agent's `mgmt_addr` (and its
hostname, its id) are only claims, and could name any host. A node beating from
10.0.0.5 that claims `evil.attacker.example` would otherwise send its replica's
other shards there (`--dist-init-addr`, LLMGW_LEADER), Prometheus, and whoever
reads the endpoint off the pages. So a node's address is the one its
registrations and inventories came from (`Node.source_addr`, as
nodes/ratelimit.py `client_address` sees it), or its `mgmt_addr` when that is an
IP address inside one of the operator's LLMGW_TRUSTED_TARGET_NETWORKS (for nodes
whose traffic reaches the control plane through a NAT or a proxy the hop count
does not see past). A node with neither has no address.

llama-server, vLLM and SGLang all serve the OpenAI-compatible API under `/v1`
on the shard's port; the node page and the admin show it, from `endpoint`.
"""

from __future__ import annotations

import ipaddress

from django.conf import settings


def trusted_address(claimed: str, source: str | None) -> str | None:
    """A node's address as a host for `host:port` (an IPv6 one bracketed), or None when none is trusted.

    `claimed` is the node's `mgmt_addr`, `source` its `source_addr`.
    """
    try:
        address = ipaddress.ip_address(claimed)
    except ValueError:
        address = None
    if address is None or not any(address in network for network in settings.LLMGW_TRUSTED_TARGET_NETWORKS):
        address = ipaddress.ip_address(source) if source else None
    if address is None:
        return None
    return f"[{address}]" if address.version == 6 else str(address)


def endpoint(address: str, port: int) -> str:
    return f"http://{address}:{port}/v1"
