"""What one gateway counted, taken from HAProxy: requests and tokens per tenant, model and replica.

HAProxy's Lua filter (deploy/gateway_usage.lua) adds up each answer's `usage` as the engine
reported it; `take` reads those totals over the admin socket (`llmgw usage take`, which zeroes
them). Apart from the database (gateway.usage), so the sync needs no Django to run.
"""

from __future__ import annotations

from dataclasses import dataclass

from gateway.runtime import Runtime


@dataclass
class Counted:
    requests: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0

    def add(self, other: Counted) -> None:
        self.requests += other.requests
        self.prompt_tokens += other.prompt_tokens
        self.completion_tokens += other.completion_tokens


# (tenant, served model, replica): what one gateway counted for them.
Key = tuple[str, str, str]


def take(runtime: Runtime) -> dict[Key, Counted]:
    """What HAProxy counted since the last take; HAProxy starts again from zero."""
    taken: dict[Key, Counted] = {}
    for line in runtime.ask("llmgw usage take").splitlines():
        fields = line.split()
        if len(fields) != 6 or not all(f.isdigit() for f in fields[3:]):
            continue
        tenant, model, replica, requests, prompt, completion = fields
        taken.setdefault((tenant, model, replica), Counted()).add(Counted(int(requests), int(prompt), int(completion)))
    return taken
