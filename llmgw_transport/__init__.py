"""How the programs away from the control plane (the agent, `llmgw`) reach it: the one rule both follow.

Neither may import the other, so the rule lives here, with nothing of the
server's: a URL they will send a token to, and how its certificate is checked.
"""

from __future__ import annotations

import ipaddress
from pathlib import Path
from urllib.parse import urlparse

PLAIN_HTTP_REFUSED = (
    "http:// to a host other than loopback would send tokens, and take commands, in the clear:"
    " use https://, or say allow_insecure_http: true"
)


class InsecureUrl(ValueError):
    """A control plane URL the caller must not use as given; the message says why."""


def is_loopback(host: str) -> bool:
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_url(url: str, allow_insecure_http: bool = False) -> None:
    """Refuse what is not https://, unless it is plain HTTP to loopback or the config allows it by name."""
    parsed = urlparse(url)
    if parsed.scheme not in ("http", "https") or not parsed.hostname:
        raise InsecureUrl(f"expected an https:// URL, got {url!r}")
    if parsed.scheme == "http" and not allow_insecure_http and not is_loopback(parsed.hostname):
        raise InsecureUrl(PLAIN_HTTP_REFUSED)


def verify(ca_file: str) -> str | bool:
    """requests' `verify`: the given certificate authority's file, else the system's; never off."""
    if not ca_file:
        return True
    if not Path(ca_file).is_file():
        raise InsecureUrl(f"no such certificate authority file {ca_file}")
    return ca_file
