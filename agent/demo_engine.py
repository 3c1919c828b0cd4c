"""A stand-in inference engine for machines without a model. It is a demo, not an engine.

`python -m agent.demo_engine --port 8100` serves a minimal OpenAI-style
`POST /v1/completions` and `POST /v1/chat/completions` (streamed as server-sent
events ending in `data: [DONE]` when asked) that burn CPU and hold memory for each
request in proportion to `max_tokens`, and `GET /metrics` with gauges named as vLLM
names them (`vllm:num_requests_running`, `vllm:num_requests_waiting`), so the agent,
Prometheus and the pages have something real to measure. The "text" it returns is
made up. With `LLMGW_ENGINE_API_KEY` set, as the agent starts it, `/v1/` requests
must carry it as `Authorization: Bearer …`, as llama-server's and vLLM's do. A stream
ends with its `usage` when the request asks (`stream_options.include_usage`), or always
with `--enable-force-include-usage`, as vLLM (0.11.1 to 0.18) does; with
`continuous_usage_stats` asked too, every event carries the running usage, as vLLM's do.
"""

from __future__ import annotations

import argparse
import hashlib
import hmac
import json
import os
import socket
import sys
import threading
import time
import uuid
from collections.abc import Generator, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

MAX_TOKENS = 4096
# vLLM's buckets for vllm:time_to_first_token_seconds (seconds), so the same rules read both.
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0)


class Engine:
    def __init__(
        self,
        model: str,
        cpu_ms_per_token: float,
        kib_per_token: int,
        max_running: int,
        ms_between_tokens: float = 0,
        ms_to_first_token: float = 0,
    ):
        self.model = model
        self.cpu_seconds_per_token = cpu_ms_per_token / 1000
        self.seconds_between_tokens = ms_between_tokens / 1000
        self.seconds_to_first_token = ms_to_first_token / 1000
        self.bytes_per_token = kib_per_token * 1024
        self.slots = threading.Semaphore(max_running)
        self.lock = threading.Lock()
        self.running = 0
        self.waiting = 0
        self.prompt_tokens = 0
        self.generation_tokens = 0
        # Time to first token, from a request's arrival (its wait for a slot included): a histogram.
        self.ttft_counts = [0] * len(TTFT_BUCKETS)
        self.ttft_count = 0
        self.ttft_sum = 0.0

    def observe_first_token(self, seconds: float) -> None:
        with self.lock:
            self.ttft_count += 1
            self.ttft_sum += seconds
            for i, bound in enumerate(TTFT_BUCKETS):
                if seconds <= bound:
                    self.ttft_counts[i] += 1

    def complete(self, prompt: str, max_tokens: int) -> dict[str, Any]:
        text = self.generate(prompt, max_tokens)
        prompt_tokens = len(prompt.split())
        return {
            "id": f"cmpl-{uuid.uuid4().hex[:12]}",
            "object": "text_completion",
            "created": int(time.time()),
            "model": self.model,
            "choices": [{"index": 0, "text": text, "finish_reason": "length", "logprobs": None}],
            "usage": usage_of(prompt_tokens, max_tokens),
        }

    def generate(self, prompt: str, max_tokens: int) -> str:
        return " ".join(self.words(prompt, max_tokens))

    def words(self, prompt: str, max_tokens: int) -> Generator[str]:
        """The made-up words one by one, after waiting for a slot as a real engine's queue would.

        The slot is held until the last word is taken (or the generator is closed: a client
        that went away), so a stream counts as running for as long as it runs.
        """
        arrived = time.monotonic()
        with self.lock:
            self.waiting += 1
        with self.slots:
            with self.lock:
                self.waiting -= 1
                self.running += 1
                self.prompt_tokens += len(prompt.split())
            try:
                for i, word in enumerate(self._generate(prompt, max_tokens)):
                    if i == 0:
                        self.observe_first_token(time.monotonic() - arrived)
                    yield word
            finally:
                with self.lock:
                    self.running -= 1

    def _generate(self, prompt: str, max_tokens: int) -> Iterator[str]:
        # Memory held for the whole request, touched page by page so it is resident, like a KV cache.
        cache = bytearray(self.bytes_per_token * max_tokens)
        for i in range(0, len(cache), 4096):
            cache[i] = 1
        digest = hashlib.sha256(prompt.encode()).digest()
        if self.seconds_to_first_token:
            # A prompt's prefill without the CPU it would burn: a known time to first token.
            time.sleep(self.seconds_to_first_token)
        for i in range(max_tokens):
            if i and self.seconds_between_tokens:
                # A slow model without the CPU it would burn: streams that last, for drains and failovers.
                time.sleep(self.seconds_between_tokens)
            deadline = time.thread_time() + self.cpu_seconds_per_token
            while time.thread_time() < deadline:
                digest = hashlib.sha256(digest).digest()
            with self.lock:
                self.generation_tokens += 1
            yield f"w{digest[0]:02x}"

    def metrics(self) -> str:
        with self.lock:
            running, waiting = self.running, self.waiting
            prompt, generation = self.prompt_tokens, self.generation_tokens
            buckets, count, total = list(self.ttft_counts), self.ttft_count, self.ttft_sum
        label = f'{{model_name="{self.model}"}}'
        ttft = "".join(
            f'vllm:time_to_first_token_seconds_bucket{{model_name="{self.model}",le="{bound}"}} {n}\n'
            for bound, n in zip(TTFT_BUCKETS, buckets, strict=True)
        )
        return (
            "# HELP vllm:num_requests_running Number of requests currently running.\n"
            "# TYPE vllm:num_requests_running gauge\n"
            f"vllm:num_requests_running{label} {running}\n"
            "# HELP vllm:num_requests_waiting Number of requests waiting to run.\n"
            "# TYPE vllm:num_requests_waiting gauge\n"
            f"vllm:num_requests_waiting{label} {waiting}\n"
            "# HELP vllm:prompt_tokens_total Prompt tokens processed.\n"
            "# TYPE vllm:prompt_tokens_total counter\n"
            f"vllm:prompt_tokens_total{label} {prompt}\n"
            "# HELP vllm:generation_tokens_total Tokens generated.\n"
            "# TYPE vllm:generation_tokens_total counter\n"
            f"vllm:generation_tokens_total{label} {generation}\n"
            "# HELP vllm:time_to_first_token_seconds Time to first token, its wait for a slot included.\n"
            "# TYPE vllm:time_to_first_token_seconds histogram\n"
            f"{ttft}"
            f'vllm:time_to_first_token_seconds_bucket{{model_name="{self.model}",le="+Inf"}} {count}\n'
            f"vllm:time_to_first_token_seconds_sum{label} {total}\n"
            f"vllm:time_to_first_token_seconds_count{label} {count}\n"
        )


def usage_of(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


def chat_prompt(messages: object) -> str:
    """The messages' contents joined, as a chat template would feed them to a model."""
    if not isinstance(messages, list) or not all(
        isinstance(m, dict) and isinstance(m.get("content", ""), str) for m in messages
    ):
        raise ValueError("messages must be a list of objects with string contents")
    return "\n".join(m.get("content", "") for m in messages)


class Handler(BaseHTTPRequestHandler):
    engine: Engine
    # Empty: every request is answered (a demo started by hand).
    api_key: str = ""
    # Every stream ends with its usage, asked or not.
    force_include_usage: bool = False
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True

    def do_GET(self) -> None:
        if self.path == "/metrics":
            self._send(200, self.engine.metrics().encode(), "text/plain; version=0.0.4")
        elif self.path == "/health":
            self._json(200, {"status": "ok"})
        elif self.path == "/v1/models":
            self._json(200, {"object": "list", "data": [{"id": self.engine.model, "object": "model"}]})
        else:
            self._json(404, {"error": {"message": "not found"}})

    def do_POST(self) -> None:
        if self.path not in ("/v1/completions", "/v1/chat/completions"):
            self._json(404, {"error": {"message": "not found"}})
            return
        if not self._authorized():
            self._json(401, {"error": {"message": "invalid api key", "type": "authentication_error"}})
            return
        chat = self.path == "/v1/chat/completions"
        try:
            length = int(self.headers.get("Content-Length", "0"))
            if not 0 <= length <= 1_000_000:
                raise ValueError("body too large")
            request = json.loads(self.rfile.read(length) or b"{}")
            prompt = chat_prompt(request.get("messages")) if chat else request.get("prompt", "")
            max_tokens = request.get("max_tokens", 16)
            if not isinstance(prompt, str) or not isinstance(max_tokens, int) or not 1 <= max_tokens <= MAX_TOKENS:
                raise ValueError(f"prompt must be a string and max_tokens an integer from 1 to {MAX_TOKENS}")
        except (ValueError, AttributeError) as exc:
            self._json(400, {"error": {"message": str(exc)}})
            return
        if request.get("stream") is True:
            options = request.get("stream_options")
            options = options if isinstance(options, dict) else {}
            usage = self.force_include_usage or options.get("include_usage") is True
            running = usage and options.get("continuous_usage_stats") is True
            self._stream(prompt, max_tokens, chat, usage, running)
        elif chat:
            self._json(200, self._chat(self.engine.complete(prompt, max_tokens)))
        else:
            self._json(200, self.engine.complete(prompt, max_tokens))

    def _authorized(self) -> bool:
        if not self.api_key:
            return True
        sent = self.headers.get("Authorization", "").removeprefix("Bearer ")
        return hmac.compare_digest(sent.encode(), self.api_key.encode())

    def _chat(self, completion: dict[str, Any]) -> dict[str, Any]:
        choice = completion["choices"][0]
        return {
            **completion,
            "id": "chat" + completion["id"],
            "object": "chat.completion",
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": choice["text"]},
                    "finish_reason": choice["finish_reason"],
                }
            ],
        }

    def _stream(self, prompt: str, max_tokens: int, chat: bool, usage: bool = False, running: bool = False) -> None:
        """Server-sent events, one per word, then `[DONE]`: the shape OpenAI clients read.

        With `stream_options: {"include_usage": true}` (or `--enable-force-include-usage`), as OpenAI
        and vLLM do, a last event before `[DONE]` has no choices and the request's `usage`; with
        `continuous_usage_stats` too (`running`), every word's event has the usage so far, as vLLM's.
        """
        ident = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex[:12]}"
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        words = self.engine.words(prompt, max_tokens)
        prompt_tokens = len(prompt.split())
        try:
            for i, word in enumerate(words):
                so_far = usage_of(prompt_tokens, i + 1) if running else None
                finish = "length" if i == max_tokens - 1 else None
                self._event(ident, chat, word if i == 0 else " " + word, finish, so_far)
            if usage:
                event: dict[str, object] = {
                    "id": ident,
                    "object": "chat.completion.chunk" if chat else "text_completion",
                    "choices": [],
                    "usage": usage_of(prompt_tokens, max_tokens),
                }
                self._chunk(f"data: {json.dumps(event)}\n\n".encode())
            self._chunk(b"data: [DONE]\n\n")
            self._chunk(b"")
        finally:
            # A client gone mid-stream: the words stop being made and the slot is freed.
            words.close()

    def _event(self, ident: str, chat: bool, piece: str, finish: str | None, usage: dict[str, int] | None) -> None:
        event: dict[str, object]
        if chat:
            choice = {"index": 0, "delta": {"content": piece}, "finish_reason": finish}
            event = {"id": ident, "object": "chat.completion.chunk", "model": self.engine.model}
        else:
            choice = {"index": 0, "text": piece, "finish_reason": finish}
            event = {"id": ident, "object": "text_completion", "model": self.engine.model}
        event["choices"] = [choice]
        if usage is not None:
            event["usage"] = usage
        self._chunk(f"data: {json.dumps(event)}\n\n".encode())

    def _chunk(self, data: bytes) -> None:
        self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        self.wfile.flush()

    def _json(self, status: int, body: dict[str, Any]) -> None:
        self._send(status, json.dumps(body).encode(), "application/json")

    def _send(self, status: int, body: bytes, content_type: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass


class Server(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request: socket.socket | tuple[bytes, socket.socket], client_address: Any) -> None:
        # A client (or a proxy closing an idle pooled connection) gone is the normal end of a connection.
        if isinstance(sys.exc_info()[1], ConnectionError):
            return
        super().handle_error(request, client_address)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m agent.demo_engine", description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--model", default="demo")
    parser.add_argument("--served-model-name", default="", help="the name answers give the model (vLLM's flag)")
    parser.add_argument("--cpu-ms-per-token", type=float, default=2.0, help="CPU time burnt per generated token")
    parser.add_argument("--kib-per-token", type=int, default=64, help="memory held per token while a request runs")
    parser.add_argument("--max-running", type=int, default=4, help="requests served at once; the rest wait")
    parser.add_argument("--ms-between-tokens", type=float, default=0, help="wall-clock pause between tokens")
    parser.add_argument(
        "--enable-force-include-usage",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="end every stream with its usage, asked or not (vLLM's flag)",
    )
    parser.add_argument("--ms-to-first-token", type=float, default=0, help="wall-clock pause before the first token")
    args = parser.parse_args(argv)
    Handler.engine = Engine(
        args.served_model_name or args.model,
        args.cpu_ms_per_token,
        args.kib_per_token,
        args.max_running,
        args.ms_between_tokens,
        args.ms_to_first_token,
    )
    Handler.api_key = os.environ.get("LLMGW_ENGINE_API_KEY", "")
    Handler.force_include_usage = args.enable_force_include_usage
    Server((args.host, args.port), Handler).serve_forever()


if __name__ == "__main__":
    main()
