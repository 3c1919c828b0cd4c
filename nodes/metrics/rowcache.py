"""Rendered text per database row, kept between scrapes while the row is unchanged.

The inventory changes rarely and is read on every scrape. Like
kube-state-metrics, which renders an object's series when the object changes,
a row is rendered the first time it is seen and again only when one of its
values changed; a row is its own key, so any change is a miss. Each scrape
keeps only the rows it saw, so the cache never holds more than the current
inventory, and a deleted node's text goes with its row.

Most scrapes find every row as it was: the rows are then compared as one list
(in C, some milliseconds for 80,000 GPU rows) and the last answer is given
again, the same list, which lets a caller keep what it derived from it.
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
        self.last: tuple[list[Row], list[Text]] = ([], [])

    def refresh(self, rows: Iterable[Row]) -> list[Text]:
        """The text of each row, in order; rows not given this time are forgotten.

        The answer is the last one, the same list, when the rows are the last ones: callers only read it.
        """
        given = list(rows)
        last_rows, last_texts = self.last
        if given == last_rows:
            return last_texts
        previous, current = self.entries, {}
        for row in given:
            text = previous.get(row)
            if text is None:
                text = self.render(row)
            current[row] = text
        texts = list(current.values())
        # One assignment each: a concurrent scrape sees the old or the new, never half of one;
        # `last` second, so its rows are always in `entries` or were a moment ago.
        self.entries = current
        self.last = (given, texts)
        return texts
