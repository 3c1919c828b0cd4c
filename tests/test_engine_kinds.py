"""One record per engine kind: everything else derives from it, nothing else names a kind.

The agent's config shards and the control plane's placed shards start the same command
from a kind's record; the deployments' choices, the agent's config type and what it
installs come from the records; and no module outside agent/enginekinds/ spells a kind.
"""

from __future__ import annotations

import ast
import json
import typing
from collections.abc import Iterable
from pathlib import Path

import pytest

from agent import config as agent_config
from agent import enginekinds
from agent.enginekinds import Launch, Signal
from agent.enginekinds.record import StreamUsage
from agent.provision import Want
from agent.shard_config import EngineName
from inventory import desired, engine_wants
from inventory.models import Deployment, Engine, Shard

CONFIG = {"control_plane": "https://cp.example:8000", "join_token": "x", "engines": {}}


def agent_side(engine: str, model: str, port: int, args: list[str]) -> list[str]:
    shard = {"shard": "s", "engine": engine, "model": model, "port": port, "args": args}
    if engine == "command":
        shard = {**shard, "command": args[:1], "args": args[1:]}
    (spec,) = agent_config.shard_specs(agent_config.from_mapping({**CONFIG, "shards": [shard]}))
    return spec.command


def control_plane_side(engine: str, model: str, port: int, args: list[str]) -> list[str]:
    deployment = Deployment(engine=engine, model_source=model, arguments=" ".join(args), gpus_per_shard=0)
    return desired.command(deployment, Shard(port=port, index=0))


@pytest.mark.parametrize("engine", enginekinds.NAMES)
def test_a_config_shard_and_a_placed_shard_start_the_same_command(engine):
    args = ["/opt/engine", "--port", "{port}"] if engine == "command" else ["--ctx-size", "4096"]
    ours = agent_side(engine, "/models/m.gguf", 8200, args)
    assert ours == control_plane_side(engine, "/models/m.gguf", 8200, args)
    if not enginekinds.get(engine).free_form:
        # Listening on every address, so that Prometheus and clients on other machines reach it.
        assert ours[ours.index("--host") + 1] == "0.0.0.0" and ours[-2:] == ["--ctx-size", "4096"]


def test_the_deployment_choices_are_the_placeable_kinds():
    assert Engine.choices == [(kind.name, kind.label) for kind in enginekinds.KINDS if kind.placeable]
    assert (Engine.LLAMA_CPP, Engine.DEMO, Engine.COMMAND) == ("llama.cpp", "demo", "command")


def test_sglang_and_llama_cpp_are_asked_for_their_metrics():
    assert "--enable-metrics" in control_plane_side(Engine.SGLANG, "/m", 1, [])
    assert "--metrics" in control_plane_side(Engine.LLAMA_CPP, "/m", 1, [])


def test_llama_cpp_gets_threads_slots_and_gpu_layers():
    argv = enginekinds.command_line("llama.cpp", Launch("/m/q.gguf", 9000, threads=4, parallel=2, gpus=1))
    assert argv == [
        "llama-server", "--model", "/m/q.gguf", "--host", "0.0.0.0", "--port", "9000", "--metrics",
        "--threads", "4", "--parallel", "2", "--n-gpu-layers", "999",
    ]  # fmt: skip


def test_a_placed_cpu_shard_gets_its_cores_as_threads():
    deployment = Deployment(engine=Engine.LLAMA_CPP, model_source="/m/q.gguf", gpus_per_shard=0, cpu_cores_per_shard=8)
    argv = desired.command(deployment, Shard(port=9000, index=0))
    assert argv[argv.index("--threads") + 1] == "8" and "--n-gpu-layers" not in argv


def test_multi_node_sglang_joins_its_leader():
    argv = enginekinds.command_line("sglang", Launch("/m", 9000, gpus=8, shards=2, shard_index=1, leader="a:9000"))
    assert argv[argv.index("--tp-size") + 1] == "8"
    assert argv[argv.index("--nnodes") :][:6] == ["--nnodes", "2", "--node-rank", "1", "--dist-init-addr", "a:9000"]


@pytest.mark.parametrize(
    ("version", "head"),
    [
        ("", ["vllm", "serve", "/m"]),
        ("0.11.0", ["vllm", "serve", "/m"]),
        ("0.5.0", ["vllm", "serve", "/m"]),
        ("0.4.3", ["python3", "-m", "vllm.entrypoints.openai.api_server", "--model", "/m"]),
    ],
)
def test_the_version_chooses_the_template(version, head):
    argv = enginekinds.command_line("vllm", Launch("/m", 9000, gpus=2), version=version)
    assert argv[: len(head)] == head
    assert argv[len(head) :] == ["--host", "0.0.0.0", "--port", "9000", "--tensor-parallel-size", "2"]


@pytest.mark.parametrize("kind", [k for k in enginekinds.KINDS if not k.free_form], ids=lambda kind: kind.name)
def test_every_engine_answers_with_the_served_model_name_not_the_weights_path(kind):
    deployment = Deployment(
        name="chat-prod", served_model_name="chat", engine=kind.name, model_source="/m/q.gguf", gpus_per_shard=0
    )
    argv = desired.command(deployment, Shard(port=9000, index=0))
    assert argv[argv.index(kind.served_name_flag) + 1] == "chat"
    # Before the operator's own arguments, so that theirs win.
    assert kind.command_line(Launch("/m", served_name="chat", extra=("--x",)))[-1] == "--x"


def test_an_installed_binary_replaces_the_program():
    argv = enginekinds.command_line("vllm", Launch("/m"), prefix=["/var/lib/llmgw/engines/vllm/0.11.0/bin/vllm"])
    assert argv[:2] == ["/var/lib/llmgw/engines/vllm/0.11.0/bin/vllm", "serve"]


@pytest.mark.parametrize(
    ("engine", "version", "how", "flag"),
    [
        # vLLM's flag ends a stream without stream_options with usage from 0.11.1 (before, only a
        # stream that had them); from 0.19.0 it also puts the running usage on every event, counted too.
        ("vllm", "", StreamUsage.ASKED, None),
        ("vllm", "0.11.0", StreamUsage.ASKED, None),
        ("vllm", "0.11.1", StreamUsage.FLAG, "--enable-force-include-usage"),
        ("vllm", "0.18.1", StreamUsage.FLAG, "--enable-force-include-usage"),
        ("vllm", "0.19.0", StreamUsage.FLAG, "--enable-force-include-usage"),
        ("sglang", "", StreamUsage.ASKED, None),
        ("sglang", "0.5.10", StreamUsage.FLAG, "--stream-response-default-include-usage"),
        ("llama.cpp", "", StreamUsage.TIMINGS, None),
        ("demo", "", StreamUsage.FLAG, "--enable-force-include-usage"),
    ],
)
def test_the_version_chooses_how_streams_report_usage_and_the_flag_that_makes_them(engine, version, how, flag):
    kind = enginekinds.get(engine)
    assert kind.usage_in_streams(version).how == how
    argv = kind.command_line(Launch("/m", 9000, extra=("--x",)), version)
    if flag:
        # Before the operator's own arguments, so that theirs win (vLLM: --no-enable-force-include-usage).
        assert argv[-2:] == [flag, "--x"]
    else:
        assert not [word for word in argv if "usage" in word]


def test_the_engines_doc_tells_each_kinds_stream_usage_as_its_record_does():
    """docs/engines.md's table, row for row, from the records (version ranges from their `since`)."""
    rows = []
    for kind in enginekinds.KINDS:
        entries = kind.stream_usage
        for entry, following in zip(entries, [*entries[1:], None], strict=True):
            versions = [f"≥ {entry.since}" if entry.since != "0" else "", f"< {following.since}" if following else ""]
            flags = " ".join(f"`{flag}`" for flag in entry.flags) or "—"
            rows.append(f"| `{kind.name}` | {', '.join(v for v in versions if v) or 'all'} | {entry.how} | {flags} |")
    text = (ROOT / "docs" / "engines.md").read_text()
    missing = [row for row in rows if row not in text]
    assert not missing, "\n".join(missing)


def test_the_engines_doc_tells_what_the_gateway_adds_to_each_kinds_streams_as_its_record_does():
    text = (ROOT / "docs" / "engines.md").read_text()
    added = {kind.name: f"`{kind.running_usage}`" if kind.running_usage else "—" for kind in enginekinds.KINDS}
    rows = [f"| `{name}` | {members} |" for name, members in added.items()]
    missing = [row for row in rows if row not in text]
    assert not missing, "\n".join(missing)


def test_what_the_gateway_adds_to_each_kinds_streams_is_json_members_without_spaces():
    # The sync writes them as a map value over HAProxy's Runtime API, whose words are split at spaces;
    # the relay puts them inside the request's object, so they must read as members of one.
    for kind in enginekinds.KINDS:
        if kind.running_usage:
            assert not any(c.isspace() for c in kind.running_usage), kind.name
            assert isinstance(json.loads("{" + kind.running_usage + "}"), dict), kind.name


def test_the_command_engine_fills_in_port_and_model():
    argv = enginekinds.command_line("command", Launch("/m/x", 7000, extra=("run", "--port={port}", "{model}")))
    assert argv == ["run", "--port=7000", "/m/x"]


@pytest.mark.parametrize(
    ("text", "key"), [("0.10.1rc2", (0, 10, 1)), ("v1.2", (1, 2)), ("0.3.36", (0, 3, 36)), ("dev", ())]
)
def test_version_key(text, key):
    assert enginekinds.version_key(text) == key


def test_the_control_plane_builds_commands_from_the_agents_templates():
    deployment = Deployment(
        engine=Engine.SGLANG, model_source="/m", arguments="--x 1", gpus_per_shard=2, shards_per_replica=2
    )
    shard = Shard(port=9000, index=1)
    launch = enginekinds.Launch(
        model="/m", port=9000, threads=0, gpus=2, shards=2, shard_index=1, leader="a:1", extra=("--x", "1")
    )
    assert desired.command(deployment, shard, "a:1") == enginekinds.command_line(Engine.SGLANG, launch)
    # The control plane's SGLang shards export metrics, as the agent's own do.
    assert "--enable-metrics" in desired.command(deployment, shard, "a:1")


# -- one record, and nowhere else ---------------------------------------------------------------

ROOT = Path(__file__).resolve().parent.parent
# Every package of the product: the agent, the control plane's apps and site, the CLI.
PACKAGES = ("agent", "inventory", "nodes", "opsapi", "gateway", "lib", "livestate", "llmgwctl", "llmgw_site")
RECORDS = ROOT / "agent" / "enginekinds"
# The same words in another sense, each with where and why; a kind named there in a kind's
# sense would still be caught, as every other word of those files is checked.
OTHER_SENSES = {
    ("llmgwctl/main.py", "command"): "argparse's name for the sub-command",
    ("agent/demo_engine.py", "demo"): "the model name the stand-in serves by default",
    ("inventory/management/commands/setup_demo.py", "demo"): "the demo deployment's name and model",
    ("gateway/management/commands/ensure_demo_key.py", "demo"): "the demo tenant's name",
}


def kind_literals(path: Path, names: Iterable[str]) -> list[tuple[int, str]]:
    """(line, word) of each string literal in `path` that is exactly an engine kind's name."""
    wanted = set(names)
    tree = ast.parse(path.read_text(), str(path))
    return [
        (node.lineno, node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in wanted
    ]


def sources(packages: Iterable[str], root: Path = ROOT) -> list[Path]:
    found = []
    for package in packages:
        folder = root / package
        # A check of a folder that is gone passes without reading anything: fail instead.
        assert folder.is_dir(), f"{folder} is missing: the check would read nothing there"
        found += [p for p in sorted(folder.rglob("*.py")) if "migrations" not in p.parts]
    return found


def test_no_module_outside_the_records_names_an_engine_kind():
    named = []
    for path in sources(PACKAGES):
        if path.is_relative_to(RECORDS):
            continue
        where = str(path.relative_to(ROOT))
        named += [
            f"{where}:{line}: {word!r}"
            for line, word in kind_literals(path, enginekinds.NAMES)
            if (where, word) not in OTHER_SENSES
        ]
    assert named == [], "engine kinds are named in agent/enginekinds/ only"


def test_the_check_finds_a_kind_named_elsewhere(tmp_path):
    (tmp_path / "inventory").mkdir()
    (tmp_path / "inventory" / "wrong.py").write_text(
        'INSTALLED = {"sglang": "0.5.3"}\n\ndef f(engine):\n    return engine == "command"\n'
    )
    [path] = sources(["inventory"], tmp_path)
    assert kind_literals(path, enginekinds.NAMES) == [(1, "sglang"), (4, "command")]


def test_the_check_fails_when_a_package_is_missing(tmp_path):
    with pytest.raises(AssertionError, match="missing"):
        sources(["web"], tmp_path)


def test_the_other_senses_are_still_there():
    # An exception for a word no longer present would hide the next real use of it.
    for where, word in OTHER_SENSES:
        assert word in [w for _, w in kind_literals(ROOT / where, enginekinds.NAMES)], where


# -- what is derived from the records -------------------------------------------------------------


def test_the_agent_config_accepts_exactly_the_kinds():
    assert typing.get_args(EngineName) == enginekinds.NAMES


def test_the_demo_engine_is_an_ordinary_record():
    demo = enginekinds.get(Engine.DEMO)
    config = agent_config.from_mapping(
        {**CONFIG, "shards": [{"shard": "d", "engine": "demo", "model": "chat", "port": 8100}]}
    )
    (spec,) = agent_config.shard_specs(config)
    assert spec.command == [
        "python3",
        "-m",
        "agent.demo_engine",
        "--host",
        "0.0.0.0",
        "--port",
        "8100",
        "--model",
        "chat",
        "--enable-force-include-usage",
    ]
    assert demo.runs(spec.command) and demo.install is None and demo.readiness is enginekinds.Readiness.HEALTH
    # It exports vLLM's names, so its shards chart like vLLM's.
    assert Signal.REQUESTS_WAITING in demo.metric_names()


def test_the_agent_installs_what_the_records_say():
    installable = {kind.name: kind.install for kind in enginekinds.KINDS if kind.install}
    assert frozenset(installable) == engine_wants.INSTALLED_BY_LLMGW
    for name, install in installable.items():
        assert Want(name).resolved() == Want(name, install.pinned, install.default_variant)
    assert Want(Engine.COMMAND).resolved() == Want(Engine.COMMAND)


def test_the_default_probes_are_the_records():
    assert agent_config.default_probes() == {kind.name: list(kind.probe) for kind in enginekinds.KINDS if kind.probe}


@pytest.mark.parametrize("kind", enginekinds.KINDS, ids=lambda kind: kind.name)
def test_every_command_a_kind_builds_is_one_its_agent_runs(kind):
    extra = ("/opt/engine", "--port", "{port}") if kind.free_form else ("--x",)
    launch = Launch("/m", 9000, extra=extra)
    versions = [t.since for t in kind.templates] or [""]
    for version in versions:
        argv = kind.command_line(launch, version)
        assert kind.runs(argv, allowed_programs=["/opt/engine"]), (kind.name, version, argv)
    assert not kind.runs(["/bin/sh", "-c", "id"])
