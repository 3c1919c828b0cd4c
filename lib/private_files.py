"""Secrets written to files only their owner may read, from the first byte on.

Writing a file and then `chmod`ing it leaves it readable by everyone (under the
usual umask) for a moment, long enough for another user's process to open it
and keep reading. The file is opened with mode 0600 instead, and an old file
being replaced is narrowed before anything is written into it.
"""

from __future__ import annotations

import os
from pathlib import Path

PRIVATE = 0o600


def write_private(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    # O_NOFOLLOW: a link planted where the secret goes must not send it elsewhere.
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, PRIVATE)
    try:
        os.fchmod(fd, PRIVATE)
        os.write(fd, text.encode())
    finally:
        os.close(fd)
