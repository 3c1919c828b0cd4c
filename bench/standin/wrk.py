"""An engine that costs almost nothing and a client that is not Python: what bench.gateway's 64 connections need.

At 64 streams the Python stand-in engine and the Python client took both of the machine's
cores, and what the gateway added could not be told from the wait for a core. Here:

- `FixedEngine`: HAProxy answering from memory, one frontend per answer: a chat completion
  (`http-request return … file`), the same answer as a stream of SSE chunks ending
  `data: [DONE]` sent at once, and that stream paced by a Lua service (`core.msleep`): the
  role's chunk, `pace_ms` later the tokens' chunks, `pace_ms` later the finish, the usage
  and `[DONE]`; so 64 streams are in flight at once without 64 busy senders, and the
  timers' jitter (two sleeps, not one a token) stays small beside what is measured;
- `run`: `wrk` (Debian's, a C client on one thread) with a Lua script POSTing one
  realistic chat-completion body with an `Authorization` header over N kept-alive
  connections, its latency percentiles (request written to answer read, µs) read back
  from the script's `done` as JSON.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from devstack import gateway as devgateway
from devstack.polling import wait_until
from devstack.ports import free_port, port_open

CREATED = 1764547200
CHUNK_TEXT = ["The", " capital", " of", " France", " is", " Paris", "."]
# One conversation as clients send it: a system prompt, a question, sampling settings.
SYSTEM = (
    "You are a helpful assistant for a travel company. Answer briefly and factually; if you do not "
    "know, say so. Prefer metric units, and give dates as the day, the month's name and the year."
)


def chat_body(model: str, stream: bool) -> str:
    body = {
        "model": model,
        "messages": [
            {"role": "system", "content": SYSTEM},
            {"role": "user", "content": "I am planning a weekend away in May. What is the capital of France?"},
        ],
        "max_tokens": 64,
        "temperature": 0.7,
        "top_p": 0.95,
        "stream": stream,
        "user": "bench-client-42",
    }
    if stream:
        body["stream_options"] = {"include_usage": True}
    return json.dumps(body, separators=(",", ":"))


def answer(model: str) -> str:
    """A chat completion, as engines answer one (LiteLLM parses it with the OpenAI client)."""
    return json.dumps(
        {
            "id": "chatcmpl-fixed",
            "object": "chat.completion",
            "created": CREATED,
            "model": model,
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": "".join(CHUNK_TEXT)},
                    "finish_reason": "stop",
                }
            ],
            "usage": {"prompt_tokens": 58, "completion_tokens": len(CHUNK_TEXT), "total_tokens": 58 + len(CHUNK_TEXT)},
        },
        separators=(",", ":"),
    )


def stream_chunks(model: str) -> list[str]:
    """The SSE events of the same answer: the role, a chunk a token, the finish, the usage, [DONE]."""

    def event(delta: dict, finish: str | None = None, usage: dict | None = None) -> str:
        chunk: dict = {
            "id": "chatcmpl-fixed",
            "object": "chat.completion.chunk",
            "created": CREATED,
            "model": model,
            "choices": [] if usage else [{"index": 0, "delta": delta, "finish_reason": finish}],
        }
        if usage:
            chunk["usage"] = usage
        return f"data: {json.dumps(chunk, separators=(',', ':'))}\n\n"

    usage = {"prompt_tokens": 58, "completion_tokens": len(CHUNK_TEXT), "total_tokens": 58 + len(CHUNK_TEXT)}
    return [
        event({"role": "assistant", "content": ""}),
        *(event({"content": text}) for text in CHUNK_TEXT),
        event({}, "stop"),
        event({}, usage=usage),
        "data: [DONE]\n\n",
    ]


PACED_LUA = """
local bursts = {%s}
core.register_service("paced", "http", function(applet)
    applet:receive()
    applet:set_status(200)
    applet:add_header("content-type", "text/event-stream")
    applet:add_header("cache-control", "no-cache")
    applet:start_response()
    for i, burst in ipairs(bursts) do
        if i > 1 then core.msleep(%d) end
        applet:send(burst)
    end
end)
"""


def bursts(chunks: list[str]) -> list[str]:
    """The paced stream's three sends: the role's chunk; the tokens'; the finish, the usage and [DONE]."""
    return [chunks[0], "".join(chunks[1:-3]), "".join(chunks[-3:])]


def lua_string(text: str) -> str:
    return "[==[" + text + "]==]"


@dataclass
class FixedEngine:
    """HAProxy (`nbthread 1`) answering `model` three ways, each on its port: `json`, `sse` and `paced`."""

    model: str
    pace_ms: int = 25

    def __post_init__(self) -> None:
        self.ports = {"json": free_port(), "sse": free_port(), "paced": free_port()}
        self.directory = Path(tempfile.mkdtemp(prefix="bench-fixed-engine-"))
        self.process: subprocess.Popen | None = None

    def __enter__(self) -> FixedEngine:
        d = self.directory
        chunks = stream_chunks(self.model)
        (d / "answer.json").write_text(answer(self.model))
        (d / "stream.sse").write_text("".join(chunks))
        (d / "paced.lua").write_text(PACED_LUA % (", ".join(map(lua_string, bursts(chunks))), self.pace_ms))
        (d / "engine.cfg").write_text(
            f"global\n    nbthread 1\n    lua-load {d / 'paced.lua'}\n"
            # Sent as soon as written, as engines send (uvicorn and llama-server set TCP_NODELAY).
            "defaults\n    mode http\n    option http-no-delay\n"
            "    timeout client 30s\n    timeout server 30s\n    timeout connect 2s\n"
            f"frontend json\n    bind 127.0.0.1:{self.ports['json']}\n"
            f"    http-request return status 200 content-type application/json file {d / 'answer.json'}\n"
            f"frontend sse\n    bind 127.0.0.1:{self.ports['sse']}\n"
            f"    http-request return status 200 content-type text/event-stream file {d / 'stream.sse'}\n"
            f"frontend paced\n    bind 127.0.0.1:{self.ports['paced']}\n"
            "    http-request use-service lua.paced\n"
        )
        self.process = process = subprocess.Popen(
            [devgateway.haproxy_binary(), "-db", "-f", str(d / "engine.cfg")],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        try:
            wait_until(lambda: process.poll() is not None or all(map(port_open, self.ports.values())), 10, "the engine")
        except TimeoutError:
            self.__exit__()
            raise
        if process.poll() is not None:
            raise RuntimeError(f"the fixed engine's haproxy exited: {process.communicate()[1].decode()}")
        return self

    def __exit__(self, *exc) -> None:
        if self.process and self.process.poll() is None:
            self.process.terminate()
            self.process.wait(10)

    @property
    def pid(self) -> int:
        if self.process is None:
            raise RuntimeError("the fixed engine is started by entering its `with`")
        return self.process.pid


SCRIPT = """
wrk.method = "POST"
wrk.body = %s
wrk.headers["Content-Type"] = "application/json"
wrk.headers["Authorization"] = %s

function done(summary, latency, requests)
    local e = summary.errors
    io.write(string.format(
        "WRK-RESULT {\\"requests\\":%%d,\\"errors\\":%%d,\\"status_errors\\":%%d,\\"duration_us\\":%%d,"
        .. "\\"p50\\":%%d,\\"p90\\":%%d,\\"p99\\":%%d,\\"mean\\":%%.1f,\\"max\\":%%d}\\n",
        summary.requests, e.connect + e.read + e.write + e.timeout, e.status, summary.duration,
        latency:percentile(50), latency:percentile(90), latency:percentile(99), latency.mean, latency.max))
end
"""


def available() -> bool:
    return shutil.which("wrk") is not None


def script(directory: Path, name: str, body: str, key: str) -> Path:
    path = directory / f"{name}.lua"
    path.write_text(SCRIPT % (lua_string(body), lua_string(f"Bearer {key}")))
    return path


def run(port: int, lua: Path, connections: int, seconds: int, timeout: int = 10) -> dict:
    """One wrk run: requests, errors (socket, timeout and non-2xx/3xx), latency p50/p90/p99/mean/max in µs, rate."""
    command = ["wrk", "-t1", f"-c{connections}", f"-d{seconds}s", "--timeout", f"{timeout}s", "-s", str(lua)]
    started = time.monotonic()
    done = subprocess.run(
        [*command, f"http://127.0.0.1:{port}/v1/chat/completions"],
        capture_output=True,
        text=True,
        timeout=seconds + timeout + 30,
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith("WRK-RESULT ")]
    if done.returncode != 0 or not lines:
        raise RuntimeError(f"wrk failed ({done.returncode}): {done.stdout[-500:]} {done.stderr[-500:]}")
    result = json.loads(lines[-1].removeprefix("WRK-RESULT "))
    result["errors"] += result.pop("status_errors")
    result["rate"] = result["requests"] / (result["duration_us"] / 1e6) if result["duration_us"] else 0.0
    result["wall"] = time.monotonic() - started
    return result
