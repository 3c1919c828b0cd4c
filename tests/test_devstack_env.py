"""Every variable `.env.example` lists works with the development stack (`make run`, devstack.stack).

Each is read by the code; the whole example, every line set as written, is what the
settings of the stack's processes hold (with DEBUG off, so that all are in
effect); and a join token given in the environment,
as `LLMGW_JOIN_TOKEN` or `LLMGW_JOIN_TOKEN_FILE`, is the one the stack's own agent
registers with (it once named a var/join-token the stack never wrote, and exited 2).
"""

from __future__ import annotations

import ast
import json
import re
import sqlite3
from pathlib import Path

import pytest

from devstack.polling import wait_until
from devstack.ports import free_port
from devstack.stack import ROOT, Stack

EXAMPLE = ROOT / ".env.example"
# Settings named otherwise than their variable.
SETTING_OF = {"LLMGW_VAR_DIR": "VAR_DIR"}


def example() -> dict[str, str]:
    """Every variable the example lists, commented out or not, with the value it shows."""
    return dict(re.findall(r"^#?\s*([A-Z][A-Z0-9_]+)=(.*)$", EXAMPLE.read_text(), re.MULTILINE))


def string_literals(path: Path) -> set[str]:
    return {
        node.value
        for node in ast.walk(ast.parse(path.read_text(), str(path)))
        if isinstance(node, ast.Constant) and isinstance(node.value, str)
    }


def test_the_example_lists_variables():
    assert {"DEBUG", "DATABASE_URL", "LLMGW_JOIN_TOKEN", "LLMGW_VAR_DIR"} <= set(example())


def test_every_variable_the_example_lists_is_read_by_the_code():
    """By name, in the settings or in what starts the stack (not the tests)."""
    code = [*(ROOT / "llmgw_site").glob("*.py"), *(ROOT / "devstack").glob("*.py")]
    read = set().union(*(string_literals(path) for path in code))
    assert set(example()) - read == set()


def test_the_whole_example_is_what_the_stacks_processes_are_set_to(tmp_path):
    # DEBUG off, as in production: then every variable is in effect (SECURE_HSTS_SECONDS only counts then).
    given = {**example(), "DEBUG": "false", "LLMGW_VAR_DIR": str(tmp_path / "var")}
    stack = Stack(tmp_path, env=given, web_port=free_port(), prometheus_port=free_port())
    names = {name: SETTING_OF.get(name, name) for name in given}
    show = (
        "import json; from django.conf import settings; "
        f"names = {names!r}; "
        "value = lambda v: [str(x) for x in v] if isinstance(v, list | tuple) "
        "else v if isinstance(v, bool | int | float) else str(v); "
        "print(json.dumps({n: value(getattr(settings, s)) for n, s in names.items() if hasattr(settings, s)}))"
    )
    seen = json.loads(stack.manage("shell", "--no-imports", "-c", show, capture=True).stdout)
    assert {name for name in given if name not in seen} == set()
    expected = dict(given)
    if not given["LLMGW_JOIN_TOKEN"]:
        # None given: the stack makes one for its own agent (below), and the control plane reads it from the file.
        expected["LLMGW_JOIN_TOKEN"] = stack.join_token_file.read_text()
    if not given["LLMGW_ENGINE_SCRAPE_KEY"]:
        # Likewise the key Prometheus scrapes engines with: made once, kept in var/.
        expected["LLMGW_ENGINE_SCRAPE_KEY"] = (stack.var / "engine-scrape-key").read_text()
    for name, text in expected.items():
        value = seen[name]
        if isinstance(value, bool):
            assert str(value).lower() == text.lower(), name
        elif isinstance(value, int | float):
            assert value == float(text), name
        elif isinstance(value, list):
            assert value == [part.strip() for part in text.split(",") if part.strip()], name
        else:
            assert value == text, name


def node_rows(database: Path) -> list[tuple[str, str]]:
    try:
        with sqlite3.connect(f"file:{database}?mode=ro", uri=True) as db:
            return db.execute("SELECT id, liveness FROM inventory_node").fetchall()
    except sqlite3.OperationalError:
        return []


@pytest.mark.slow
@pytest.mark.parametrize("how", ["LLMGW_JOIN_TOKEN", "LLMGW_JOIN_TOKEN_FILE"])
def test_a_join_token_from_the_environment_is_the_one_the_stacks_agent_registers_with(tmp_path, redis_server, how):
    token = "join-token-from-the-environment-" + how.lower()
    secret = tmp_path / "elsewhere" / "join"
    secret.parent.mkdir()
    secret.write_text(token + "\n")
    database = tmp_path / "llmgw.sqlite3"
    var = tmp_path / "var"
    var.mkdir()
    stack = Stack(
        var,
        env={
            "DATABASE_URL": f"sqlite:///{database}",
            "REDIS_URL": redis_server if isinstance(redis_server, str) else redis_server.url,
            "LLMGW_HEARTBEAT_INTERVAL": "1",
            how: token if how == "LLMGW_JOIN_TOKEN" else str(secret),
        },
        web_port=free_port(),
        prometheus_port=free_port(),
        workers=1,
    )
    try:
        stack.manage("migrate", "--noinput", "-v0")
        stack.start_web()
        base = f"http://127.0.0.1:{stack.web_port}"
        stack.manage("setup_demo", "--var-dir", str(var), "--control-plane", base, "--no-real-model", capture=True)
        assert (var / "join-token").read_text() == token
        assert (var / "join-token").stat().st_mode & 0o077 == 0
        stack.start(stack.agent_part())
        agent = stack.parts["agent"].process
        wait_until(lambda: node_rows(database) or agent.poll() is not None, 60, "the agent to register")
        assert agent.poll() is None, (stack.logs / "agent.log").read_text()
        assert [liveness for _, liveness in node_rows(database)] == ["alive"]
    finally:
        stack.stop_all()
