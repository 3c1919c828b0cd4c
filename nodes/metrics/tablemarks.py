"""Whether an inventory table changed since it was last read, asked of PostgreSQL without reading it.

The render of /metrics (nodes/metrics/prerender.py) read every GPU, filesystem and
allocation row every 10 s: at 10,000 nodes some 230,000 rows, about half the render's
CPU and all of PostgreSQL's, in a burst beside the heartbeats, though these tables
change only when a node registers anew, a GPU's condition or a placement changes.

A table's mark is its row count with the sums of its live rows' `xmin` (the
transaction that wrote each row version) and `cmin` (the command within it). Any
insert, update or delete leaves a row version with another transaction or command, or
another count, so the mark moves; vacuum and freezing keep both. Reading a mark scans
the table but sends one line: about 11 ms for 80,000 GPU rows, where reading them was
40–130 ms of PostgreSQL and as much again of Python.

Marks are read before the rows they vouch for: a change committed between the two is
in the rows already, and its mark differs from the one kept, so it is read once more;
a change committed after both moves the mark for the next read. SQLite (development
and tests) has no such columns: there every read reads the rows.
"""

from __future__ import annotations

from collections.abc import Sequence

from django.db import connections

# One table's mark: its row count, then the sums of xmin and cmin (xid and cid cast through text).
_MARK = (
    "(SELECT count(*)::text || ':' || coalesce(sum(xmin::text::bigint), 0)::text"
    " || ':' || coalesce(sum(cmin::text::bigint), 0)::text FROM {table})"
)


def read(tables: Sequence[str], using: str = "default") -> dict[str, str] | None:
    """Each table's mark, in one query; None where the database keeps no row versions to mark."""
    connection = connections[using]
    if connection.vendor != "postgresql" or not tables:
        return None
    quote = connection.ops.quote_name
    with connection.cursor() as cursor:
        cursor.execute("SELECT " + ", ".join(_MARK.format(table=quote(table)) for table in tables))
        return dict(zip(tables, cursor.fetchone(), strict=True))
