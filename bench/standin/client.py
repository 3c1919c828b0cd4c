"""The load generator: HTTP/1.1 on raw asyncio streams, keep-alive, each request timed to its first token.

One client measures every path (the engine directly, HAProxy, LiteLLM), so what differs
between two figures is what sits in front of the engine, not the client. It parses no
more than it must: a streamed answer's first token is found by a byte pattern in the
chunk it arrives in, and only the last event (the one with `usage`) is decoded.
"""

from __future__ import annotations

import asyncio
import json
import math
import random
import re
import time
from collections.abc import Callable
from dataclasses import dataclass

# The first event carrying text: a chat delta's content or a completion's text, not empty.
FIRST_TEXT = re.compile(rb'"(?:content|text)":\s?"[^"]')


@dataclass
class Outcome:
    status: int
    sent: float  # time.perf_counter() when the request was written
    first: float | None = None  # when its first token arrived
    done: float | None = None
    completion_tokens: int = 0
    cached_tokens: int = 0
    error: str | None = None
    # The time the open-loop schedule meant to send it, so a late send is the generator's fault, not the path's.
    due: float | None = None

    @property
    def ok(self) -> bool:
        return self.status == 200 and self.error is None and self.first is not None

    @property
    def ttft(self) -> float:
        return _measured(self.first, "first token") - self.sent

    @property
    def total(self) -> float:
        return _measured(self.done, "end") - self.sent

    @property
    def scheduled(self) -> float:
        """When an open loop meant to send it."""
        return _measured(self.due, "due time")


def _measured(moment: float | None, what: str) -> float:
    # Asked only of outcomes that have it (an answered request, an open loop's); a None here is the caller's bug.
    if moment is None:
        raise ValueError(f"this outcome has no {what}")
    return moment


class Pool:
    """Keep-alive connections to one loopback port, opened when none is idle."""

    def __init__(self, port: int, host: str = "127.0.0.1"):
        self.host, self.port = host, port
        self.idle: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []

    async def take(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        while self.idle:
            reader, writer = self.idle.pop()
            if not writer.is_closing() and not reader.at_eof():
                return reader, writer
            writer.close()
        return await asyncio.open_connection(self.host, self.port, limit=1 << 22)

    def give(self, connection: tuple[asyncio.StreamReader, asyncio.StreamWriter]) -> None:
        self.idle.append(connection)

    def close(self) -> None:
        for _, writer in self.idle:
            writer.close()
        self.idle.clear()


def request_bytes(path: str, body: bytes, api_key: str | None = None) -> bytes:
    auth = f"Authorization: Bearer {api_key}\r\n" if api_key else ""
    return (
        f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n{auth}\r\n"
    ).encode() + body


def chat_body(
    model: str, messages: list[dict], max_tokens: int, stream: bool = True, extra: dict | None = None
) -> bytes:
    body = {"model": model, "messages": messages, "max_tokens": max_tokens, "stream": stream, **(extra or {})}
    if stream:
        body["stream_options"] = {"include_usage": True}
    return json.dumps(body, separators=(",", ":")).encode()


async def send(pool: Pool, request: bytes) -> Outcome:
    """One request on a pooled connection; every failure is an Outcome, never an exception."""
    try:
        connection = await pool.take()
    except OSError as exc:
        return Outcome(0, time.perf_counter(), error=f"connect: {exc}")
    reader, writer = connection
    outcome = Outcome(0, time.perf_counter())
    try:
        writer.write(request)
        keep = await _read_response(reader, outcome)
    except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError) as exc:
        outcome.error = f"{type(exc).__name__}: {exc}"
        writer.close()
        return outcome
    if keep:
        pool.give(connection)
    else:
        writer.close()
    return outcome


async def _read_response(reader: asyncio.StreamReader, outcome: Outcome) -> bool:
    head = await reader.readuntil(b"\r\n\r\n")
    status_line, *lines = head[:-4].split(b"\r\n")
    outcome.status = int(status_line.split(b" ", 2)[1])
    headers = {}
    for line in lines:
        name, _, value = line.partition(b":")
        headers[name.strip().lower()] = value.strip().lower()
    keep = headers.get(b"connection") != b"close"
    if headers.get(b"transfer-encoding") == b"chunked":
        body: bytes | bytearray = bytearray()
        while True:
            size = int((await reader.readuntil(b"\r\n")).split(b";")[0], 16)
            if size == 0:
                await reader.readuntil(b"\r\n")
                break
            data = (await reader.readexactly(size + 2))[:-2]
            body += data
            # Looked for in the new bytes and a little before, in case an event was split between chunks.
            if outcome.first is None and FIRST_TEXT.search(body, max(0, len(body) - len(data) - 64)):
                outcome.first = time.perf_counter()
    elif b"content-length" in headers:
        body = await reader.readexactly(int(headers[b"content-length"]))
    else:
        body, keep = await reader.read(), False
    outcome.done = time.perf_counter()
    if outcome.status == 200 and outcome.first is None and FIRST_TEXT.search(body):
        outcome.first = outcome.done
    _read_usage(bytes(body), outcome)
    return keep


async def get(port: int, path: str) -> bytes:
    """A GET's body (a replica's /metrics, /props) on a connection of its own."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n".encode())
        answer = await reader.read()
    finally:
        writer.close()
    head, _, body = answer.partition(b"\r\n\r\n")
    if not head.startswith(b"HTTP/1.1 200"):
        raise OSError(f"GET {path}: {head.splitlines()[0] if head else b'no answer'!r}")
    return body


def _read_usage(body: bytes, outcome: Outcome) -> None:
    at = body.rfind(b'"usage"')
    if at < 0:
        return
    start = body.rfind(b"data: ", 0, at)
    try:
        answer = json.loads(body[start + 6 : body.index(b"\n", at)] if start >= 0 else body)
    except ValueError:
        return
    usage = answer.get("usage") or {}
    outcome.completion_tokens = usage.get("completion_tokens", 0)
    outcome.cached_tokens = (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0


async def closed_loop(pool: Pool, make_request: Callable[[int], bytes], concurrency: int, count: int) -> list[Outcome]:
    """`concurrency` clients each sending its next request as soon as its last is answered, `count` in all."""
    outcomes: list[Outcome] = []
    numbers = iter(range(count))

    async def client() -> None:
        for number in numbers:
            outcomes.append(await send(pool, make_request(number)))

    await asyncio.gather(*(client() for _ in range(concurrency)))
    return outcomes


async def open_loop(
    pool: Pool, make_request: Callable[[int], bytes], rate: float, seconds: float, seed: int = 1
) -> list[Outcome]:
    """Poisson arrivals at `rate` a second for `seconds`, each sent at its time whatever came before."""
    rng = random.Random(seed)
    loop = asyncio.get_running_loop()
    tasks = []
    start = time.perf_counter()
    due = start
    number = 0

    async def one(request: bytes, at: float) -> Outcome:
        outcome = await send(pool, request)
        outcome.due = at
        return outcome

    while True:
        due += rng.expovariate(rate)
        if due - start > seconds:
            break
        if (wait := due - time.perf_counter()) > 0:
            await asyncio.sleep(wait)
        tasks.append(loop.create_task(one(make_request(number), due)))
        number += 1
    return list(await asyncio.gather(*tasks))


def quantile(values: list[float], q: float) -> float:
    """The q-quantile by linear interpolation between closest ranks; NaN for no values."""
    if not values:
        return math.nan
    ordered = sorted(values)
    position = (len(ordered) - 1) * q
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)
