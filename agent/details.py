"""A status's detail: a headline, then the last lines of a log, as much as the protocol lets a detail hold.

An install that failed and an engine that exited are both explained this way
(agent/provision/steps.py, agent/runner.py): the reader wants the end of the
output, where the error is, and the whole must fit `protocol.MAX_DETAIL`.
"""

from __future__ import annotations

from collections.abc import Sequence

from agent import protocol

# A longer line (a compiler's, a Python traceback's) is cut, so one line cannot take all the room.
LINE_CHARS = 200


def with_last_lines(head: str, lines: Sequence[str]) -> str:
    """`head`, then as many of the last `lines` as fit, in their order."""
    kept: list[str] = []
    room = protocol.MAX_DETAIL - len(head) - 1
    for line in reversed(lines):
        line = line[:LINE_CHARS]
        if len(line) + 1 > room:
            break
        kept.insert(0, line)
        room -= len(line) + 1
    return "\n".join([head, *kept])
