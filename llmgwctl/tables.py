"""Tables that fit the terminal: kubectl's plain columns, long cells cut short with an ellipsis."""

from __future__ import annotations

from collections.abc import Sequence

WIDTH = 80
GAP = "  "


def cut(text: str, width: int) -> str:
    return text if len(text) <= width else text[: max(width - 1, 0)] + "…"


def table(headers: Sequence[str], rows: Sequence[Sequence[str]], width: int = WIDTH, shrink: Sequence[int] = ()) -> str:
    """Columns padded to their widest cell; the `shrink` columns give way, widest first, until it fits."""
    widths = [max([len(h)] + [len(str(row[i])) for row in rows]) for i, h in enumerate(headers)]
    over = sum(widths) + len(GAP) * (len(widths) - 1) - width
    shrinkable = list(shrink) or [max(range(len(widths)), key=lambda i: widths[i])]
    while over > 0:
        column = max(shrinkable, key=lambda i: widths[i])
        floor = len(headers[column])
        if widths[column] <= max(floor, 4):
            break
        widths[column] -= 1
        over -= 1
    lines = []
    for cells in [headers, *rows]:
        line = GAP.join(cut(str(cell), w).ljust(w) for cell, w in zip(cells, widths, strict=True))
        lines.append(line.rstrip())
    return "\n".join(lines)


def age(seconds: float | None) -> str:
    if seconds is None:
        return "never"
    seconds = max(seconds, 0)
    if seconds < 120:
        return f"{seconds:.0f}s"
    if seconds < 7200:
        return f"{seconds / 60:.0f}m"
    if seconds < 172800:
        return f"{seconds / 3600:.0f}h"
    return f"{seconds / 86400:.0f}d"


def gib(count: int | None) -> str:
    return "—" if count is None else f"{count / 2**30:.0f}Gi"
