"""Redis or the database cut off for the length of a block, so tests see the driver fail for real."""

from __future__ import annotations

import sqlite3
import tempfile
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import livestate
from devstack.ports import free_port


@contextmanager
def redis_unreachable(settings: Any) -> Iterator[None]:
    """Point the control plane at a port where no Redis answers, for the duration of the block.

    `settings` is pytest-django's fixture, which puts REDIS_URL back afterwards.
    """
    settings.REDIS_URL = f"redis://127.0.0.1:{free_port()}/0"
    livestate.reset_client()
    try:
        yield
    finally:
        livestate.reset_client()


@contextmanager
def database_unreachable() -> Iterator[None]:
    """Point the default database connection where no database can be opened, for the duration of the block.

    The driver fails for real: SQLite is given a file in a directory that does
    not exist, PostgreSQL a port where nothing listens. Tests using it need
    `django_db(transaction=True)`, since the connection is closed and opened again.
    """
    from django.db import connection

    saved = dict(connection.settings_dict)
    keeper = None
    if connection.vendor == "sqlite":
        if connection.is_in_memory_db():
            # Closing the last connection to an in-memory database destroys it: hold another open meanwhile.
            keeper = sqlite3.connect(saved["NAME"], uri=True)
        missing_directory = Path(tempfile.gettempdir()) / f"llmgw-no-such-directory-{uuid.uuid4().hex}"
        connection.settings_dict["NAME"] = str(missing_directory / "db.sqlite3")
    else:
        connection.settings_dict.update(HOST="127.0.0.1", PORT=str(free_port()))
    connection.close()
    try:
        yield
    finally:
        connection.close()
        connection.settings_dict.clear()
        connection.settings_dict.update(saved)
        connection.ensure_connection()
        if keeper is not None:
            keeper.close()
