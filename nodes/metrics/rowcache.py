"""Rendered text per database row, kept between scrapes while the row is unchanged.

The inventory changes rarely and is read on every scrape. Like
kube-state-metrics, which renders an object's series when the object changes,
a row is rendered the first time it is seen and again only when one of its
values changed; a row is its own key, so any change is a miss. Each scrape
keeps only the rows it saw, so the cache never holds more than the current
inventory, and a deleted node's text goes with its row.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable
from typing import Generic, TypeVar

Row = TypeVar("Row", bound=Hashable)
Text = TypeVar("Text")


class RowCache(Generic[Row, Text]):
    def __init__(self, render: Callable[[Row], Text]):
        self.render = render
        self.entries: dict[Row, Text] = {}

    def refresh(self, rows: Iterable[Row]) -> list[Text]:
        """The text of each row, in order; rows not given this time are forgotten."""
        previous, current = self.entries, {}
        for row in rows:
            text = previous.get(row)
            if text is None:
                text = self.render(row)
            current[row] = text
        # One assignment: a concurrent scrape sees the old or the new dict, never half of one.
        self.entries = current
        return list(current.values())
