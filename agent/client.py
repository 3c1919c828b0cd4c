"""Talking to the control plane: registration with the join token, heartbeats with the node token.

Every call has connect and read timeouts; the errors a caller must tell apart are
`Unauthorized` (register again), `Rejected` (a 4xx naming a field: log it, carry on)
and `Unavailable` (anything else: back off and try again).
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import TypeVar

import msgspec
import requests

from agent import protocol
from llmgw_transport import verify

T = TypeVar("T")
log = logging.getLogger("agent.client")


class Unavailable(Exception):
    """The control plane did not answer usefully: a network error, a timeout, a 5xx or a garbled body."""


class Unauthorized(Exception):
    """401: the token is not (or no longer) accepted."""


class Rejected(Exception):
    """Another 4xx: the control plane refused this body and said which field and why."""

    def __init__(self, status: int, field: str, reason: str):
        super().__init__(f"HTTP {status}: {field}: {reason}")
        self.status, self.field, self.reason = status, field, reason


class TokenStore:
    """The node token in `<state_dir>/node-token`, readable by the agent's user only."""

    def __init__(self, state_dir: Path):
        self.path = Path(state_dir) / "node-token"

    def load(self, node_id: str) -> str | None:
        try:
            saved = json.loads(self.path.read_text())
        except (OSError, ValueError):
            return None
        # A token was issued to one node id; after the id changes it must not be used.
        if not isinstance(saved, dict) or saved.get("node_id") != node_id:
            return None
        token = saved.get("token")
        return token if isinstance(token, str) else None

    def save(self, node_id: str, token: str) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        tmp = self.path.with_suffix(".tmp")
        # Created 0600 from the first byte, then renamed over the old one so a crash never leaves half a token.
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump({"node_id": node_id, "token": token}, f)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o600)
        os.replace(tmp, self.path)

    def forget(self) -> None:
        self.path.unlink(missing_ok=True)


class ControlPlane:
    def __init__(
        self,
        url: str,
        connect_timeout: float = 3.05,
        read_timeout: float = 10.0,
        session: requests.Session | None = None,
        ca_file: str = "",
    ):
        self.url = url.rstrip("/")
        self.timeout = (connect_timeout, read_timeout)
        self.session = session or requests.Session()
        # The control plane's certificate is always checked: against ca_file where the config names one.
        # Passed with each request: requests lets REQUESTS_CA_BUNDLE in the environment override a session's.
        self.verify = verify(ca_file)
        self.session.headers["User-Agent"] = "llmgw-agent"
        self.session.headers["Content-Type"] = "application/json"

    def register(self, join_token: str, message: protocol.Register) -> protocol.Registered:
        body = self._post("/api/v1/register", join_token, protocol.encode(message))
        return self._decode(body, protocol.Registered)

    def heartbeat(self, token: str, message: protocol.Heartbeat) -> protocol.HeartbeatReply:
        body = self._post("/api/v1/heartbeat", token, protocol.encode(message))
        return self._decode(body, protocol.HeartbeatReply)

    def _post(self, path: str, token: str, body: bytes) -> bytes:
        try:
            response = self.session.post(
                self.url + path,
                data=body,
                headers={"Authorization": f"Bearer {token}"},
                timeout=self.timeout,
                verify=self.verify,
            )
            content = response.content
        except requests.RequestException as exc:
            raise Unavailable(f"{type(exc).__name__}: {exc}") from None
        if response.status_code == 401:
            raise Unauthorized(_reason(content))
        if 400 <= response.status_code < 500:
            try:
                rejection = protocol.decode(content, protocol.Rejection)
                raise Rejected(response.status_code, rejection.field, rejection.reason)
            except (msgspec.ValidationError, msgspec.DecodeError):
                raise Rejected(response.status_code, "", content[:200].decode(errors="replace")) from None
        if response.status_code not in (200, 201):
            raise Unavailable(f"HTTP {response.status_code}")
        return content

    @staticmethod
    def _decode(body: bytes, kind: type[T]) -> T:
        try:
            return protocol.decode(body, kind)
        except (msgspec.ValidationError, msgspec.DecodeError) as exc:
            raise Unavailable(f"unexpected answer: {exc}") from None


def _reason(content: bytes) -> str:
    try:
        rejection = protocol.decode(content, protocol.Rejection)
        return f"{rejection.field}: {rejection.reason}"
    except (msgspec.ValidationError, msgspec.DecodeError):
        return content[:200].decode(errors="replace")
