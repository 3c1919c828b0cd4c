"""One HTTP GET that is finished, whole, by a deadline.

`requests`' timeout bounds each read, so a server sending a byte a second holds a
request for as long as it likes, and running requests in threads to escape that
leaves the threads behind. Here every socket operation waits at most the time left
before the deadline, on the caller's own thread: when the deadline passes the
request is over and nothing of it keeps running.

The request is HTTP/1.0 with `Connection: close`, so the answer is simply every
byte until the server closes; `http.client` then parses what was read.
"""

from __future__ import annotations

import http.client
import io
import socket
import ssl
import time
from urllib.parse import urlsplit

# A node's hour of six charts is well under a megabyte; more is not an answer we asked for.
MAX_BYTES = 16 * 2**20


class DeadlinePassed(Exception):
    """The deadline came before the whole answer did."""


class NotHTTP(Exception):
    """What came back does not parse as an HTTP response."""


class TooLarge(Exception):
    """The answer is longer than MAX_BYTES."""


def _left(deadline: float) -> float:
    left = deadline - time.monotonic()
    if left <= 0:
        raise DeadlinePassed
    return left


class _Replay:
    """What http.client.HTTPResponse needs of a socket, over bytes already read."""

    def __init__(self, data: bytes):
        self._data = data

    def makefile(self, *args: object, **kwargs: object) -> io.BytesIO:
        return io.BytesIO(self._data)


def get(url: str, deadline: float, max_bytes: int = MAX_BYTES) -> tuple[int, bytes]:
    """GET `url` by `deadline` (a `time.monotonic()` value); returns the status and the body.

    Raises DeadlinePassed, NotHTTP, TooLarge, or OSError when it cannot connect.
    """
    parts = urlsplit(url)
    secure = parts.scheme == "https"
    host = parts.hostname or ""
    port = parts.port or (443 if secure else 80)
    target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    host_header = parts.netloc.rpartition("@")[2]
    request = (
        f"GET {target} HTTP/1.0\r\nHost: {host_header}\r\nAccept: application/json\r\n"
        "Accept-Encoding: identity\r\nConnection: close\r\n\r\n"
    ).encode("ascii")
    received = bytearray()
    try:
        sock = socket.create_connection((host, port), timeout=_left(deadline))
        try:
            if secure:
                sock = ssl.create_default_context().wrap_socket(sock, server_hostname=host)
            sock.settimeout(_left(deadline))
            sock.sendall(request)
            while True:
                sock.settimeout(_left(deadline))
                chunk = sock.recv(65536)
                if not chunk:
                    break
                received += chunk
                if len(received) > max_bytes:
                    raise TooLarge
        finally:
            sock.close()
    except TimeoutError:
        # The socket's own timeout is the time that was left, so it ran out too.
        raise DeadlinePassed from None
    response = http.client.HTTPResponse(_Replay(bytes(received)))  # type: ignore[arg-type]
    try:
        response.begin()
        body = response.read()
    except (http.client.HTTPException, ValueError):
        raise NotHTTP from None
    return response.status, body
