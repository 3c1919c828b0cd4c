"""Helpers for the agent's tests: a stand-in control plane and an agent running in threads."""

import threading

import pytest

from agent import config as agent_config
from agent.loop import Agent, Tuning
from agent.procfs import REAL, Roots
from devstack.fakecp import FakeControlPlane

FAST = Tuning(
    backoff_base=0.001,
    backoff_cap=0.01,
    connect_timeout=0.5,
    read_timeout=0.2,
    rediscover_every=3600,
    grace=1.0,
    tick=0.01,
    quiet_for=3600,
)


@pytest.fixture
def plane():
    with FakeControlPlane() as plane:
        yield plane


@pytest.fixture
def make_agent(tmp_path):
    """Build an agent for the stand-in control plane; `start()` runs it in a thread until the test ends."""
    running = []

    def make(plane: FakeControlPlane, tuning: Tuning = FAST, roots: Roots = REAL, **extra) -> Agent:
        token_file = tmp_path / "join-token"
        if not token_file.exists():
            token_file.write_text(plane.join_token)
        config = agent_config.from_mapping(
            {
                "control_plane": plane.url,
                "join_token_file": str(token_file),
                "state_dir": str(tmp_path / "state"),
                "interval": 0.05,
                "node_id": "node-under-test",
                "engines": {},
                **extra,
            }
        )
        agent = Agent(config, roots=roots, tuning=tuning)

        def start() -> Agent:
            thread = threading.Thread(target=agent.run, daemon=True)
            thread.start()
            running.append((agent, thread))
            return agent

        agent.start = start  # type: ignore[attr-defined]  # the tests' own way to run it in a thread
        return agent

    yield make
    for agent, thread in running:
        agent.stop()
        thread.join(10)
        assert not thread.is_alive(), "the agent did not stop"
