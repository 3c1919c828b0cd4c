"""Every documented key, read from a file; every bad file, one line and exit code 2."""

import io
import re
import subprocess
import sys
from pathlib import Path

import pytest

from agent import config as agent_config

ROOT = Path(__file__).resolve().parents[2]
BASE = "control_plane: https://cp.example:8000\njoin_token: join-secret\n"


def load_text(tmp_path: Path, text: str) -> agent_config.Config:
    path = tmp_path / "agent.yaml"
    path.write_text(text)
    return agent_config.load(path)


# One case per key: the YAML that sets it and what the loaded config must then say.
KEY_CASES = {
    "control_plane": (BASE, lambda c, tmp: c.control_plane == "https://cp.example:8000"),
    "allow_insecure_http": (
        "control_plane: http://cp.example:8000\njoin_token: j\nallow_insecure_http: true\n",
        lambda c, tmp: c.allow_insecure_http and c.control_plane == "http://cp.example:8000",
    ),
    # Any file will do for loading; tests/agent/test_transport.py verifies a certificate with a real one.
    "ca_file": (BASE + "ca_file: {tmp}/join\n", lambda c, tmp: c.ca_file == f"{tmp}/join"),
    "node_id": (BASE + "node_id: gpu-07.rack-3\n", lambda c, tmp: c.node_id == "gpu-07.rack-3"),
    "join_token": (BASE, lambda c, tmp: c.read_join_token() == "join-secret"),
    "join_token_file": (
        "control_plane: https://cp.example:8000\njoin_token_file: {tmp}/join\n",
        lambda c, tmp: c.read_join_token() == "from-the-file",
    ),
    "state_dir": (BASE + "state_dir: {tmp}/state\n", lambda c, tmp: c.state_dir == f"{tmp}/state"),
    "interval": (BASE + "interval: 2.5\n", lambda c, tmp: c.interval == 2.5),
    "labels": (BASE + "labels:\n  rack: r3\n  zone: a\n", lambda c, tmp: c.labels == {"rack": "r3", "zone": "a"}),
    "model_dirs": (BASE + "model_dirs: [/models, /mnt/hf]\n", lambda c, tmp: c.model_dirs == ["/models", "/mnt/hf"]),
    "fabrics": (
        BASE + "fabrics:\n  - name: ib-east\n    hcas: [mlx5_0, mlx5_1]\n    rate_gbps: 400\n",
        lambda c, tmp: [(f.name, f.hcas, f.rate_gbps) for f in c.fabrics] == [("ib-east", ["mlx5_0", "mlx5_1"], 400)],
    ),
    "engines": (
        BASE + "engines:\n  vllm: /opt/vllm/bin/vllm\n  sglang: [python3, -m, sglang.launch_server]\n",
        lambda c, tmp: (
            c.engine_commands == {"vllm": ["/opt/vllm/bin/vllm"], "sglang": ["python3", "-m", "sglang.launch_server"]}
        ),
    ),
    "shards": (
        BASE
        + "engines:\n  vllm: /opt/vllm/bin/vllm\n"
        + "shards:\n  - shard: s1\n    replica: r1\n    engine: vllm\n    model: /models/llama\n    port: 8100\n"
        + "    args: [--tensor-parallel-size, '2']\n    env: {CUDA_VISIBLE_DEVICES: '0,1'}\n",
        lambda c, tmp: (
            [(s.shard, s.replica, s.engine, s.model, s.command, s.env, s.port) for s in agent_config.shard_specs(c)]
            == [
                (
                    "s1",
                    "r1",
                    "vllm",
                    "/models/llama",
                    [
                        "/opt/vllm/bin/vllm",
                        "serve",
                        "/models/llama",
                        "--host",
                        "0.0.0.0",
                        "--port",
                        "8100",
                        "--tensor-parallel-size",
                        "2",
                    ],
                    {"CUDA_VISIBLE_DEVICES": "0,1"},
                    8100,
                )
            ]
        ),
    ),
    "env": (BASE + "env:\n  HF_HOME: /models/cache\n", lambda c, tmp: c.env == {"HF_HOME": "/models/cache"}),
    "cgroup_root": (BASE + "cgroup_root: {tmp}/cg\n", lambda c, tmp: c.cgroup_root == f"{tmp}/cg"),
    "engine_cache": (BASE + "engine_cache: /srv/llmgw-cache\n", lambda c, tmp: c.engine_cache == "/srv/llmgw-cache"),
    "command_programs": (
        BASE + "command_programs: [/opt/tools/serve-model]\n",
        lambda c, tmp: c.command_programs == ["/opt/tools/serve-model"],
    ),
}


def test_every_key_has_a_case():
    assert set(KEY_CASES) == set(agent_config.KEYS)


@pytest.mark.parametrize("key", sorted(KEY_CASES))
def test_key_is_read_from_a_file(tmp_path, key):
    (tmp_path / "join").write_text("from-the-file\n")
    text, check = KEY_CASES[key]
    config = load_text(tmp_path, text.replace("{tmp}", str(tmp_path)))
    assert check(config, tmp_path)


def test_every_key_is_documented():
    documented = set(re.findall(r"^\| `([a-z_]+)` \|", (ROOT / "docs" / "agent.md").read_text(), re.M))
    assert set(agent_config.KEYS) <= documented


def test_the_example_config_loads(tmp_path):
    text = (ROOT / "deploy" / "agent.example.yaml").read_text()
    token = tmp_path / "join-token"
    token.write_text("x")
    config = load_text(tmp_path, text.replace("/etc/llmgw/join-token", str(token)))
    assert config.control_plane.startswith("http")
    assert agent_config.shard_specs(config)


def test_defaults(tmp_path):
    config = load_text(tmp_path, BASE)
    assert config.interval == 5.0
    assert config.state_dir == "/var/lib/llmgw-agent"
    assert config.engine_commands == {"vllm": ["vllm"], "llama.cpp": ["llama-server"]}
    assert config.node_id  # derived, never empty


def test_default_node_id_is_stable_and_derived_from_machine_id(tmp_path):
    fixtures = Path(__file__).parent / "fixtures" / "etc"
    first = agent_config.default_node_id(fixtures)
    assert first == agent_config.default_node_id(fixtures)
    assert "0123456789abcdef" not in first  # the machine id itself is not exposed
    other = tmp_path / "etc"
    other.mkdir()
    (other / "machine-id").write_text("fedcba9876543210fedcba9876543210\n")
    assert agent_config.default_node_id(other) != first


def test_without_machine_id_the_node_id_is_the_hostname(tmp_path, monkeypatch):
    monkeypatch.setattr(agent_config.socket, "gethostname", lambda: "gpu 07.example")
    assert agent_config.default_node_id(tmp_path) == "gpu-07.example"


def test_engine_templates(tmp_path):
    config = load_text(
        tmp_path,
        BASE
        + "shards:\n"
        + "  - {shard: l, engine: llama.cpp, model: /m/q4.gguf, port: 8200}\n"
        + "  - {shard: s, engine: sglang, model: /m/qwen, port: 8300}\n"
        + "  - {shard: c, engine: command, command: [/bin/my-engine, --serve], args: [--fast]}\n",
    )
    commands = {s.shard: s.command for s in agent_config.shard_specs(config)}
    assert commands["l"] == [
        "llama-server",
        "--model",
        "/m/q4.gguf",
        "--host",
        "0.0.0.0",
        "--port",
        "8200",
        "--metrics",
    ]
    assert commands["s"][:3] == ["python3", "-m", "sglang.launch_server"]
    assert commands["s"][3:] == ["--model-path", "/m/qwen", "--host", "0.0.0.0", "--port", "8300", "--enable-metrics"]
    assert commands["c"] == ["/bin/my-engine", "--serve", "--fast"]


BAD = [
    ("intervall: 5\n", "intervall: unknown key"),
    ("interval: soon\n", "interval: expected `float`, got `str`"),
    ("interval: 0\n", "interval: expected `float` > 0"),
    ("labels: [a, b]\n", "labels: expected `object`, got `array`"),
    ("labels: {'bad key': x}\n", "labels:"),
    ("model_dirs: /models\n", "model_dirs: expected `array`, got `str`"),
    ("fabrics: [{name: ib}]\n", "fabrics[0]: object missing required field `hcas`"),
    ("fabrics: [{name: ib, hcas: [mlx5_0], rate: 100}]\n", "fabrics[0]: object contains unknown field `rate`"),
    ("shards: [{shard: s, engine: tgi, model: m}]\n", "shards[0].engine: invalid enum value 'tgi'"),
    ("shards: [{shard: s, engine: vllm}]\n", "shards[0].model: required for engine vllm"),
    ("shards: [{shard: s, engine: command}]\n", "shards[0].command: required when engine is command"),
    ("shards: [{shard: s, engine: command, command: [x]}, {shard: s, engine: command, command: [y]}]\n", "twice"),
    ("shards: [{shard: s, engine: vllm, model: m, port: 70000}]\n", "shards[0].port: expected `int` <= 65535"),
    ("env: {'1BAD': x}\n", "env: '1BAD' is not an environment variable name"),
    ("engines: {vllm: []}\n", "engines.vllm: expected a binary"),
    ("node_id: 'has space'\n", "node_id: expected letters"),
    ("command_programs: ['']\n", "command_programs: expected program names or paths"),
    ("command_programs: /bin/sh\n", "command_programs: expected `array`, got `str`"),
]


@pytest.mark.parametrize(("extra", "message"), BAD)
def test_bad_values_name_the_key(tmp_path, extra, message):
    with pytest.raises(agent_config.ConfigError) as error:
        load_text(tmp_path, BASE + extra)
    assert message in str(error.value)
    assert "\n" not in str(error.value)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("join_token: x\n", "control_plane: required"),
        ("control_plane: https://cp:8000\n", "join_token: required"),
        ("control_plane: ftp://cp\njoin_token: x\n", "control_plane: expected an https:// URL"),
        ("control_plane: https://cp:8000\njoin_token_file: /nonexistent/token\n", "join_token_file: no such file"),
        ("- a\n- b\n", "must be a mapping"),
        ("control_plane: [unclosed\n", "not valid YAML at line"),
    ],
)
def test_missing_or_malformed_files(tmp_path, text, message):
    with pytest.raises(agent_config.ConfigError) as error:
        load_text(tmp_path, text)
    assert message in str(error.value)


def test_a_bad_config_exits_2_with_one_line_and_no_traceback(tmp_path):
    path = tmp_path / "agent.yaml"
    path.write_text(BASE + "interval: soon\n")
    done = subprocess.run(
        [sys.executable, "-m", "agent", "--config", str(path), "--once", "--print"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=30,
    )
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [f"agent: {path}: interval: expected `float`, got `str`"]
    assert done.stdout == ""


@pytest.mark.django_db  # setup_demo also creates the demo deployment
def test_the_config_setup_demo_writes_for_make_run_loads(tmp_path):
    from django.core.management import call_command

    (tmp_path / "join-token").write_text("demo-join")  # devstack.stack writes it before the agent starts
    call_command("setup_demo", var_dir=str(tmp_path), control_plane="http://127.0.0.1:8123", stdout=io.StringIO())
    config = agent_config.load(tmp_path / "agent.yaml")
    assert config.control_plane == "http://127.0.0.1:8123"
    assert config.read_join_token() == "demo-join"
    assert config.state_dir == str(tmp_path / "agent-state")
    assert config.labels == {"role": "demo"}
