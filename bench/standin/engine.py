"""A stand-in inference engine with real queueing: slots, a queue behind them, a token rate, a prefix cache.

    python -m bench.standin.engine --listen 9001 --listen 9002:0.5 --slots 4

Each `--listen PORT[:SPEED]` is one replica in this process (one event loop serves
them all, so a fleet of eight costs one Python process). A replica decodes at most
`--slots` requests at once; the rest wait in its queue in arrival order. In a slot a
request first pays its prefill, the prompt's uncached tokens at `--prefill-tps`, then
produces one token every 1/`--decode-tps` seconds; SPEED scales both (0.5 is a replica
half as fast). A prompt's leading 16-word blocks seen recently are in the replica's
prefix cache (LRU, `--cache-tokens`) and cost no prefill, as llama.cpp's and vLLM's
prefix caching do. A rate of 0 answers at once (for measuring what sits in front).

It speaks what the gateway forwards: `POST /v1/chat/completions` and `/v1/completions`,
streaming (SSE, ending `data: [DONE]`) or not, with `usage` (prompt, completion and
cached tokens; on every event too when the stream asks for vLLM's running usage,
`stream_options.continuous_usage_stats`, as the gateway's relay does for vLLM);
`GET /health`, `/v1/models`, `/props` (`total_slots`) and `/metrics` with llama.cpp's names
(`llamacpp:requests_processing`, `llamacpp:requests_deferred`,
`llamacpp:tokens_predicted_total`, `llamacpp:predicted_tokens_seconds`). Given
`--api-key`, `/v1/` answers only `Authorization: Bearer <key>`, as llama-server does.
A client that disconnects cancels its request, queued or decoding. A token is a word.

It stands in for an engine in benchmarks and tests of what sits in front of engines;
agent/demo_engine.py, which burns real CPU and memory for the agent to measure, is the
stand-in the agent runs on nodes.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import hashlib
import json
import time
import uuid
from collections import OrderedDict
from collections.abc import AsyncGenerator
from dataclasses import dataclass

MAX_TOKENS = 4096
MAX_BODY = 4 * 1024 * 1024
BLOCK = 16
WORDS = ("the", "sea", "is", "blue", "and", "wide", "under", "a", "grey", "sky", "of", "rain")


@dataclass(frozen=True)
class Pace:
    """How fast one replica works; rates are per slot, 0 means at once."""

    slots: int = 4
    decode_tps: float = 50.0
    prefill_tps: float = 2000.0
    speed: float = 1.0
    cache_tokens: int = 16384

    def prefill_seconds(self, tokens: int) -> float:
        return tokens / (self.prefill_tps * self.speed) if self.prefill_tps else 0.0

    def token_seconds(self) -> float:
        return 1 / (self.decode_tps * self.speed) if self.decode_tps else 0.0


class BadRequest(Exception):
    def __init__(self, param: str, message: str):
        super().__init__(message)
        self.param = param


class PrefixCache:
    """Prompt blocks by the hash of everything up to and including them, least recently used out first."""

    def __init__(self, capacity_tokens: int):
        self.capacity = max(capacity_tokens // BLOCK, 0)
        self.blocks: OrderedDict[bytes, None] = OrderedDict()

    @staticmethod
    def chain(tokens: list[str]) -> list[bytes]:
        hashes, digest = [], b""
        for start in range(0, len(tokens) - BLOCK + 1, BLOCK):
            digest = hashlib.blake2b(digest + " ".join(tokens[start : start + BLOCK]).encode(), digest_size=16).digest()
            hashes.append(digest)
        return hashes

    def hits(self, chain: list[bytes]) -> int:
        """Tokens of the prompt's longest cached prefix."""
        found = 0
        for digest in chain:
            if digest not in self.blocks:
                break
            self.blocks.move_to_end(digest)
            found += BLOCK
        return found

    def store(self, chain: list[bytes]) -> None:
        for digest in chain:
            self.blocks[digest] = None
            self.blocks.move_to_end(digest)
        while len(self.blocks) > self.capacity:
            self.blocks.popitem(last=False)


class Replica:
    """One engine: its slots, its queue, its cache and its counters."""

    def __init__(self, model: str, pace: Pace, api_key: str | None = None):
        self.model = model
        self.pace = pace
        self.api_key = api_key
        self.slots = asyncio.Semaphore(pace.slots)
        self.cache = PrefixCache(pace.cache_tokens)
        self.processing = 0
        self.deferred = 0
        self.prompt_tokens = 0
        self.predicted_tokens = 0
        # Tokens and decoding seconds of requests finished since the last scrape (llama.cpp's
        # predicted_tokens_seconds is their mean speed, reset by each read of /metrics).
        self.window_tokens = 0
        self.window_seconds = 0.0

    async def generate(self, tokens: list[str], max_tokens: int, counts: dict) -> AsyncGenerator[str, None]:
        """Waits for a slot, prefills, then yields `max_tokens` words at the replica's pace."""
        self.deferred += 1
        try:
            await self.slots.acquire()
        finally:
            self.deferred -= 1
        self.processing += 1
        try:
            chain = PrefixCache.chain(tokens)
            cached = min(self.cache.hits(chain), len(tokens))
            counts["cached"] = cached
            await asyncio.sleep(self.pace.prefill_seconds(len(tokens) - cached))
            # Stored once computed: a request arriving while this one prefills finds nothing yet.
            self.cache.store(chain)
            self.prompt_tokens += len(tokens)
            loop = asyncio.get_running_loop()
            started, step = loop.time(), self.pace.token_seconds()
            for i in range(max_tokens):
                # Paced from the start, so a late wake-up does not slow every token after it.
                if step and (wait := started + i * step - loop.time()) > 0:
                    await asyncio.sleep(wait)
                self.predicted_tokens += 1
                yield WORDS[i % len(WORDS)]
            self.window_tokens += max_tokens
            self.window_seconds += loop.time() - started
        finally:
            self.processing -= 1
            self.slots.release()

    def metrics(self) -> str:
        speed = self.window_tokens / self.window_seconds if self.window_seconds else 0.0
        self.window_tokens, self.window_seconds = 0, 0.0
        rows = (
            ("prompt_tokens_total", "counter", "Number of prompt tokens processed.", self.prompt_tokens),
            ("tokens_predicted_total", "counter", "Number of generation tokens processed.", self.predicted_tokens),
            ("predicted_tokens_seconds", "gauge", "Average generation throughput in tokens/s.", round(speed, 3)),
            ("requests_processing", "gauge", "Number of requests processing.", self.processing),
            ("requests_deferred", "gauge", "Number of requests deferred.", self.deferred),
        )
        return "".join(
            f"# HELP llamacpp:{name} {text}\n# TYPE llamacpp:{name} {kind}\nllamacpp:{name} {value}\n"
            for name, kind, text, value in rows
        )


def prompt_words(path: str, request: dict) -> list[str]:
    if path == "/v1/completions":
        prompt = request.get("prompt")
        if not isinstance(prompt, str):
            raise BadRequest("prompt", "prompt must be a string")
        return prompt.split()
    messages = request.get("messages")
    if not isinstance(messages, list) or not messages:
        raise BadRequest("messages", "messages must be a non-empty list")
    words = []
    for message in messages:
        content = message.get("content") if isinstance(message, dict) else None
        if isinstance(content, list):
            content = " ".join(part.get("text", "") for part in content if isinstance(part, dict))
        if not isinstance(content, str):
            raise BadRequest("messages", "each message needs a string content")
        words += content.split()
    return words


def parse_request(path: str, body: bytes) -> tuple[list[str], int, bool, bool]:
    """The prompt's words, max_tokens, whether streamed, and whether each event carries a running usage."""
    try:
        request = json.loads(body)
    except ValueError:
        raise BadRequest("body", "the body is not JSON") from None
    if not isinstance(request, dict):
        raise BadRequest("body", "the body must be a JSON object")
    max_tokens = request.get("max_completion_tokens", request.get("max_tokens", 16))
    if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or not 1 <= max_tokens <= MAX_TOKENS:
        raise BadRequest("max_tokens", f"max_tokens must be an integer from 1 to {MAX_TOKENS}")
    stream = request.get("stream", False)
    if not isinstance(stream, bool):
        raise BadRequest("stream", "stream must be true or false")
    options = request.get("stream_options") or {}
    if not isinstance(options, dict):
        raise BadRequest("stream_options", "stream_options must be an object")
    return prompt_words(path, request), max_tokens, stream, options.get("continuous_usage_stats") is True


def error_body(message: str, kind: str, param: str | None = None) -> bytes:
    return json.dumps({"error": {"message": message, "type": kind, "param": param, "code": None}}).encode()


class Completion:
    """The OpenAI shapes of one answer, chat or plain completion."""

    def __init__(self, replica: Replica, path: str):
        self.chat = path == "/v1/chat/completions"
        self.id = f"{'chatcmpl' if self.chat else 'cmpl'}-{uuid.uuid4().hex[:16]}"
        self.model = replica.model
        self.created = int(time.time())

    def _object(self, kind: str, choice: dict, usage: dict | None = None) -> bytes:
        body = {"id": self.id, "object": kind, "created": self.created, "model": self.model, "choices": [choice]}
        if usage is not None:
            body["usage"] = usage
        return json.dumps(body, separators=(",", ":")).encode()

    def whole(self, text: str, usage: dict) -> bytes:
        if self.chat:
            choice = {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "length"}
            return self._object("chat.completion", choice, usage)
        return self._object("text_completion", {"index": 0, "text": text, "finish_reason": "length"}, usage)

    def event(self, word: str, first: bool, usage: dict | None = None) -> bytes:
        if self.chat:
            delta = {"role": "assistant", "content": word} if first else {"content": word}
            body = self._object("chat.completion.chunk", {"index": 0, "delta": delta, "finish_reason": None}, usage)
        else:
            body = self._object("text_completion", {"index": 0, "text": word, "finish_reason": None}, usage)
        return b"data: " + body + b"\n\n"

    def last_event(self, usage: dict) -> bytes:
        if self.chat:
            choice = {"index": 0, "delta": {}, "finish_reason": "length"}
            body = self._object("chat.completion.chunk", choice, usage)
        else:
            body = self._object("text_completion", {"index": 0, "text": "", "finish_reason": "length"}, usage)
        return b"data: " + body + b"\n\ndata: [DONE]\n\n"


def usage(prompt: int, completion: int, cached: int) -> dict:
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": cached},
    }


STATUS = {200: "OK", 400: "Bad Request", 401: "Unauthorized", 404: "Not Found", 413: "Payload Too Large"}


class Server:
    """HTTP/1.1 with keep-alive for one replica, on asyncio streams."""

    def __init__(self, replica: Replica):
        self.replica = replica

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while await self._one(reader, writer):
                pass
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError):
            pass
        finally:
            writer.close()

    async def _one(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        """Reads and answers one request; whether the connection stays open for another."""
        try:
            head = await reader.readuntil(b"\r\n\r\n")
        except asyncio.IncompleteReadError:
            return False
        request_line, *lines = head[:-4].decode("latin-1").split("\r\n")
        method, target, version = request_line.split(" ", 2)
        headers = {}
        for line in lines:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        if headers.get("transfer-encoding", "").lower() == "chunked":
            body = await read_chunked(reader)
        else:
            length = int(headers.get("content-length", "0"))
            if length > MAX_BODY:
                self._send(writer, 413, error_body("the body is too large", "invalid_request_error", "body"), False)
                return False
            body = await reader.readexactly(length)
        keep = version == "HTTP/1.1" and headers.get("connection", "").lower() != "close"
        path = target.split("?", 1)[0]
        if method == "POST" and path in ("/v1/chat/completions", "/v1/completions"):
            return await self._complete(reader, writer, path, headers, body, keep)
        if method == "GET" and path == "/health":
            self._send(writer, 200, b'{"status":"ok"}', keep)
        elif method == "GET" and path == "/metrics":
            self._send(writer, 200, self.replica.metrics().encode(), keep, "text/plain; version=0.0.4")
        elif method == "GET" and path == "/props":
            props = {"total_slots": self.replica.pace.slots, "model_alias": self.replica.model}
            self._send(writer, 200, json.dumps(props).encode(), keep)
        elif method == "GET" and path == "/v1/models" and self._allowed(headers):
            models = {"object": "list", "data": [{"id": self.replica.model, "object": "model", "owned_by": "standin"}]}
            self._send(writer, 200, json.dumps(models).encode(), keep)
        elif path.startswith("/v1/") and not self._allowed(headers):
            self._send(writer, 401, error_body("invalid api key", "authentication_error"), keep)
        else:
            self._send(writer, 404, error_body(f"no route {method} {path}", "invalid_request_error"), keep)
        await writer.drain()
        return keep

    def _allowed(self, headers: dict) -> bool:
        key = self.replica.api_key
        return key is None or headers.get("authorization") == f"Bearer {key}"

    async def _complete(self, reader, writer, path: str, headers: dict, body: bytes, keep: bool) -> bool:
        if not self._allowed(headers):
            self._send(writer, 401, error_body("invalid api key", "authentication_error"), keep)
            await writer.drain()
            return keep
        try:
            tokens, max_tokens, stream, running = parse_request(path, body)
        except BadRequest as exc:
            self._send(writer, 400, error_body(str(exc), "invalid_request_error", exc.param), keep)
            await writer.drain()
            return keep
        answer = functools.partial(self._stream, running=running) if stream else self._whole
        work = asyncio.ensure_future(answer(writer, path, tokens, max_tokens))
        # A client that goes away mid-request frees its slot (or its place in the queue), as a
        # real engine's does. Watched without reading: the next request may already be arriving.
        gone = asyncio.ensure_future(reader.gone.wait())
        await asyncio.wait((work, gone), return_when=asyncio.FIRST_COMPLETED)
        gone.cancel()
        if not work.done():
            work.cancel()
            return False
        work.result()
        return keep

    async def _whole(self, writer, path: str, tokens: list[str], max_tokens: int) -> None:
        counts: dict = {}
        async with contextlib.aclosing(self.replica.generate(tokens, max_tokens, counts)) as words:
            text = " ".join([word async for word in words])
        answer = Completion(self.replica, path)
        body = answer.whole(text, usage(len(tokens), max_tokens, counts["cached"]))
        self._send(writer, 200, body, True)
        await writer.drain()

    async def _stream(self, writer, path: str, tokens: list[str], max_tokens: int, running: bool) -> None:
        answer = Completion(self.replica, path)
        counts: dict = {}
        first, made = True, 0
        # Closed here, so a client gone while a token is being written frees the slot at once.
        async with contextlib.aclosing(self.replica.generate(tokens, max_tokens, counts)) as words:
            async for word in words:
                made += 1
                so_far = usage(len(tokens), made, counts["cached"]) if running else None
                event = answer.event(word if first else " " + word, first, so_far)
                if first:
                    # The headers go with the first token, as llama-server sends them once a slot has the request.
                    writer.write(
                        b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\n"
                        b"Transfer-Encoding: chunked\r\n\r\n"
                    )
                    first = False
                writer.write(b"%x\r\n%s\r\n" % (len(event), event))
                await writer.drain()
        last = answer.last_event(usage(len(tokens), max_tokens, counts["cached"]))
        writer.write(b"%x\r\n%s\r\n0\r\n\r\n" % (len(last), last))
        await writer.drain()

    @staticmethod
    def _send(writer, status: int, body: bytes, keep: bool, content_type: str = "application/json") -> None:
        writer.write(
            b"HTTP/1.1 %d %s\r\nContent-Type: %s\r\nContent-Length: %d\r\n%s\r\n"
            % (
                status,
                STATUS[status].encode(),
                content_type.encode(),
                len(body),
                b"" if keep else b"Connection: close\r\n",
            )
            + body
        )


async def read_chunked(reader: asyncio.StreamReader) -> bytes:
    parts: list[bytes] = []
    total = 0
    while True:
        size = int((await reader.readuntil(b"\r\n")).split(b";")[0], 16)
        total += size
        if total > MAX_BODY:
            raise ValueError("body too large")
        if size == 0:
            await reader.readuntil(b"\r\n")
            return b"".join(parts)
        parts.append((await reader.readexactly(size + 2))[:-2])


class _Protocol(asyncio.StreamReaderProtocol):
    """asyncio's stream protocol, also telling its reader (`reader.gone`) that the client closed or vanished."""

    def __init__(self, handler):
        reader = asyncio.StreamReader(limit=MAX_BODY)
        reader.gone = asyncio.Event()
        self._reader_gone = reader.gone
        super().__init__(reader, handler)

    def eof_received(self):
        self._reader_gone.set()
        return super().eof_received()

    def connection_lost(self, exc):
        self._reader_gone.set()
        super().connection_lost(exc)


async def serve(replicas: list[tuple[str, int, Replica]]) -> list[asyncio.Server]:
    """Starts one listening server per (host, port, replica)."""
    loop = asyncio.get_running_loop()
    servers = []
    for host, port, replica in replicas:
        handler = Server(replica).serve
        servers.append(await loop.create_server(functools.partial(_Protocol, handler), host, port, backlog=4096))
    return servers


def parse_listen(text: str) -> tuple[int, float]:
    port, _, speed = text.partition(":")
    return int(port), float(speed or 1.0)


async def run(args: argparse.Namespace) -> None:
    replicas = []
    for port, speed in (parse_listen(text) for text in args.listen):
        pace = Pace(args.slots, args.decode_tps, args.prefill_tps, speed, args.cache_tokens)
        replicas.append((args.host, port, Replica(args.model, pace, args.api_key)))
    servers = await serve(replicas)
    print(f"serving {len(servers)} replicas", flush=True)
    await asyncio.gather(*(server.serve_forever() for server in servers))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.standin.engine", description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--listen", action="append", required=True, metavar="PORT[:SPEED]", help="one per replica")
    parser.add_argument("--model", default="standin")
    parser.add_argument("--slots", type=int, default=Pace.slots, help="requests decoded at once per replica")
    parser.add_argument("--decode-tps", type=float, default=Pace.decode_tps, help="tokens per second per slot")
    parser.add_argument("--prefill-tps", type=float, default=Pace.prefill_tps, help="prompt tokens per second")
    parser.add_argument("--cache-tokens", type=int, default=Pace.cache_tokens, help="prefix cache size per replica")
    parser.add_argument("--api-key", help="answer /v1/ only with this bearer token")
    args = parser.parse_args(argv)
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    asyncio.run(run(args))


if __name__ == "__main__":
    main()
