"""Each engine kind gets its deployment's secret the way its record says, never on its command line.

llama-server and vLLM read a variable (tests/test_deployments.py); SGLang reads none, so
the agent writes the key into the YAML options file SGLang's `--config` names (SGLang
0.5.3: python/sglang/srt/server_args_config_parser.py) and names that file instead. SGLang
itself cannot run here (no GPU): a stand-in `sglang.launch_server` module records what it
was started with, and SGLang 0.5.3's reading of the file (YAML, then `--api-key VALUE`
words through argparse) is done here as it does it.
"""

from __future__ import annotations

import argparse
import json
import os
import stat
import textwrap

import pytest
import yaml

from agent import enginekinds, protocol
from agent.enginekinds import API_KEY_ENV, Launch
from agent.runner import Runner
from devstack.polling import wait_until

SGLANG = enginekinds.get("sglang")
SECRET = "s3cr3t_Key-with-dashes_AND_underscores_0123456789ab"

# Records what it was started with, then waits as an engine would.
STAND_IN = textwrap.dedent(
    """
    import json, os, sys, time
    argv = sys.argv[1:]
    path = argv[argv.index("--config") + 1] if "--config" in argv else ""
    info = os.stat(path) if path else None
    with open(os.environ["STAND_IN_OUT"], "w") as out:
        json.dump({
            "cmdline": open("/proc/self/cmdline", "rb").read().decode().rstrip("\\0").split("\\0"),
            "environ": open("/proc/self/environ", "rb").read().decode(errors="replace"),
            "path": path,
            "config": open(path).read() if path else "",
            "mode": info.st_mode if info else 0,
            "uid": info.st_uid if info else -1,
        }, out)
    time.sleep(60)
    """
)


def sglang_reads(text: str) -> str | None:
    """The api_key SGLang 0.5.3 ends with from a --config file holding `text`: the file's YAML
    becomes `--key value` words (str() of each value) parsed by its argparse parser."""
    words: list[str] = []
    for key, value in (yaml.safe_load(text) or {}).items():
        words += [f"--{key}", str(value)]
    parser = argparse.ArgumentParser(exit_on_error=False)
    parser.add_argument("--api-key")
    return parser.parse_args(words).api_key


def test_sglang_takes_its_key_from_a_file_it_reads_back_exactly():
    text = SGLANG.key_file_text({API_KEY_ENV: SECRET})
    assert text == f'api-key: "{SECRET}"\n'
    assert sglang_reads(text) == SECRET
    # Even a key YAML would read as something else unquoted (a number, a boolean, null).
    for odd in ("1234", "true", "null", "0x1F", "a: b", "#x"):
        assert sglang_reads(SGLANG.key_file_text({API_KEY_ENV: odd})) == odd


def test_a_key_sglang_would_read_as_a_flag_is_refused():
    # Such a key on its own word is what argparse takes for an option: SGLang would not start.
    with pytest.raises(argparse.ArgumentError):
        sglang_reads('api-key: "-abc"\n')
    with pytest.raises(ValueError, match="starts with '-'"):
        SGLANG.key_file_text({API_KEY_ENV: "-abc"})
    with pytest.raises(ValueError, match="line break"):
        SGLANG.key_file_text({API_KEY_ENV: "a\nb"})


def test_no_key_no_file_and_no_variable():
    assert SGLANG.key_file_text({}) == ""
    assert SGLANG.environment({API_KEY_ENV: SECRET}) == {API_KEY_ENV: SECRET}
    # The kinds that read a variable write no file.
    for name in ("llama.cpp", "vllm", "demo", "command"):
        assert enginekinds.get(name).key_file_text({API_KEY_ENV: SECRET}) == ""


def test_the_file_is_named_after_the_command_and_a_second_config_is_refused():
    command = SGLANG.command_line(Launch("/m", 30000))
    assert SGLANG.with_key_file(command, "/state/keys/s.yaml") == [*command, "--config", "/state/keys/s.yaml"]
    for theirs in (["--config", "/m/mine.yaml"], ["--config=/m/mine.yaml"]):
        with pytest.raises(ValueError, match="one --config file"):
            SGLANG.with_key_file([*command, *theirs], "/state/keys/s.yaml")


def sglang_spec(shard: str, secret: str, extra: tuple[str, ...] = ()) -> protocol.ShardSpec:
    launch = Launch("/models/m", 0, extra=extra)
    return protocol.ShardSpec(
        shard=shard,
        replica="r",
        model="/models/m",
        engine="sglang",
        command=SGLANG.command_line(launch),
        env={API_KEY_ENV: secret},
    )


@pytest.fixture
def stand_in(tmp_path):
    package = tmp_path / "standin" / "sglang"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "launch_server.py").write_text(STAND_IN)
    out = tmp_path / "started.json"
    runner = Runner(
        tmp_path / "state" / "logs",
        env={"PYTHONPATH": str(tmp_path / "standin"), "STAND_IN_OUT": str(out)},
        grace=0.5,
        backoff_base=30,
    )
    yield runner, out
    runner.stop_all(grace=0.5)


def test_an_sglang_shard_is_started_with_its_key_in_a_private_file_not_on_its_command_line(stand_in, tmp_path):
    runner, out = stand_in
    runner.reconcile([sglang_spec("s1", SECRET)])
    wait_until(lambda: out.exists() and out.read_text().endswith("}"), 10, "the stand-in to start")
    started = json.loads(out.read_text())

    assert SECRET not in " ".join(started["cmdline"])
    key_file = tmp_path / "state" / "keys" / "s1.yaml"
    assert started["cmdline"][-2:] == ["--config", str(key_file)]
    assert sglang_reads(started["config"]) == SECRET
    assert stat.S_IMODE(started["mode"]) == 0o600 and started["uid"] == os.getuid()
    assert stat.S_IMODE(key_file.parent.stat().st_mode) == 0o700

    # Removed, its file goes with it.
    runner.reconcile([])
    wait_until(lambda: (runner.poll(), "s1" not in runner.shards)[1], 10, "the shard to be removed")
    assert not key_file.exists()


def test_a_new_secret_is_written_over_the_old_one_at_the_restart(stand_in, tmp_path):
    runner, out = stand_in
    runner.reconcile([sglang_spec("s1", SECRET)])
    wait_until(lambda: out.exists() and out.read_text().endswith("}"), 10, "the stand-in to start")
    out.unlink()
    runner.reconcile([sglang_spec("s1", "the-next-secret")])
    wait_until(lambda: (runner.poll(), out.exists() and out.read_text().endswith("}"))[1], 10, "the restart")
    assert sglang_reads(json.loads(out.read_text())["config"]) == "the-next-secret"


@pytest.mark.parametrize(
    ("secret", "extra", "why"),
    [
        ("-starts-with-a-dash", (), "starts with '-'"),
        (SECRET, ("--config", "/models/mine.yaml"), "one --config file"),
    ],
)
def test_an_sglang_shard_that_cannot_get_its_key_is_failed_not_started_without_it(stand_in, secret, extra, why):
    runner, out = stand_in
    runner.reconcile([sglang_spec("s1", secret, extra)])
    (status,) = runner.statuses()
    assert status.state == "failed" and why in status.detail
    assert not out.exists()
