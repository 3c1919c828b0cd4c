"""Where clients reach a placed shard's engine: its OpenAI-compatible API on the node's address.

llama-server, vLLM and SGLang all serve it under `/v1` on the shard's port; the node page
and the admin show it, from the same function.
"""

from __future__ import annotations


def node_address(mgmt_addr: str, hostname: str, node_id: str) -> str:
    """The address others reach a node at: the one its agent reported, else its name."""
    return mgmt_addr or hostname or node_id


def endpoint(address: str, port: int) -> str:
    return f"http://{address}:{port}/v1"
