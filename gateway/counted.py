"""What one gateway counted, taken from HAProxy: requests and tokens per tenant, model and replica, and
streams' times to first token per model and replica.

HAProxy's Lua filter (deploy/gateway_usage.lua) adds up each answer's `usage` as the engine
reported it, and times each stream's first bytes from the request's arrival; `take` reads both
over the admin socket (`llmgw usage take`, which zeroes them). Apart from the database
(gateway.usage), so the sync needs no Django to run.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from gateway.runtime import Runtime

# Upper bounds of the time-to-first-token buckets, in seconds: deploy/gateway_usage.lua's BOUNDS_US
# (vLLM's buckets for its own histogram). A take line with another number of buckets is not read.
TTFT_BOUNDS = (
    0.001,
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
    160.0,
    640.0,
    2560.0,
)
TTFT_LINE = "ttft"


@dataclass
class Counted:
    requests: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0

    def add(self, other: Counted) -> None:
        self.requests += other.requests
        self.prompt_tokens += other.prompt_tokens
        self.completion_tokens += other.completion_tokens


@dataclass
class FirstTokens:
    """Streams' times to first token: the count in each bucket of TTFT_BOUNDS (not cumulative; the last
    is over every bound) and their sum, in microseconds."""

    counts: list[int] = field(default_factory=lambda: [0] * (len(TTFT_BOUNDS) + 1))
    sum_us: int = 0

    def add(self, other: FirstTokens) -> None:
        self.counts = [a + b for a, b in zip(self.counts, other.counts, strict=True)]
        self.sum_us += other.sum_us


# (tenant, served model, replica): what one gateway counted for them.
Key = tuple[str, str, str]
# (served model, replica): the streams one gateway timed for them.
Where = tuple[str, str]


@dataclass
class Taken:
    usage: dict[Key, Counted] = field(default_factory=dict)
    first_tokens: dict[Where, FirstTokens] = field(default_factory=dict)


def parse(answer: str) -> Taken:
    """`llmgw usage take`'s answer: a line per tenant, model and server (6 fields), and one per model and
    server whose streams were timed (`ttft MODEL SERVER SUM_US` and a count per bucket)."""
    taken = Taken()
    for line in answer.splitlines():
        fields = line.split()
        if len(fields) == 6 and all(f.isdigit() for f in fields[3:]):
            tenant, model, replica, requests, prompt, completion = fields
            more = Counted(int(requests), int(prompt), int(completion))
            taken.usage.setdefault((tenant, model, replica), Counted()).add(more)
        elif (
            len(fields) == 4 + len(TTFT_BOUNDS) + 1 and fields[0] == TTFT_LINE and all(f.isdigit() for f in fields[3:])
        ):
            _, model, replica, sum_us, *counts = fields
            timed = FirstTokens([int(n) for n in counts], int(sum_us))
            taken.first_tokens.setdefault((model, replica), FirstTokens()).add(timed)
    return taken


def take(runtime: Runtime) -> Taken:
    """What HAProxy counted and timed since the last take; HAProxy starts again from zero."""
    return parse(runtime.ask("llmgw usage take"))
