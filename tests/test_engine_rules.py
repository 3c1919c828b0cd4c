"""The engine rules: generated from the engine kinds' records, current, valid, and unit-tested for every engine."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from agent import enginekinds
from agent.enginekinds import Signal
from agent.enginekinds import rules as engine_metrics
from scripts import gen_engine_rules

ROOT = Path(__file__).resolve().parent.parent
RULES = ROOT / "deploy" / "rules"
PROMTOOL = shutil.which("promtool")
needs_promtool = pytest.mark.skipif(PROMTOOL is None, reason="promtool missing: apt-get install prometheus")


def generator():
    return gen_engine_rules


def test_the_committed_rules_are_what_the_table_generates():
    assert (RULES / "engines.rules.yml").read_text() == generator().render()


def test_the_check_mode_notices_a_stale_file(tmp_path, monkeypatch):
    module = generator()
    stale = tmp_path / "engines.rules.yml"
    stale.write_text(module.render().replace("rate(", "irate("))
    monkeypatch.setattr(module, "TARGET", stale)
    monkeypatch.setattr(module, "ROOT", tmp_path)
    assert module.main(["--check"]) == 1
    assert module.main([]) == 0 and module.main(["--check"]) == 0


@needs_promtool
def test_the_generated_rules_are_valid():
    result = subprocess.run([PROMTOOL, "check", "rules", str(RULES / "engines.rules.yml")], capture_output=True)
    assert result.returncode == 0, result.stdout + result.stderr


@needs_promtool
def test_the_engine_rules_pass_their_unit_tests():
    result = subprocess.run(
        [PROMTOOL, "test", "rules", "rules/tests/engines.yml"], capture_output=True, cwd=RULES.parent, timeout=120
    )
    assert result.returncode == 0, (result.stdout + result.stderr).decode()


def test_every_series_of_the_table_is_fed_to_a_unit_test():
    tested = (RULES / "tests" / "engines.yml").read_text()
    assert [m for m in engine_metrics.all_metrics() if f"series: '{m}{{" not in tested] == []
    assert [e for e in (k.name for k in enginekinds.KINDS if k.metrics) if f'engine="{e}"' not in tested] == []


def test_every_engine_alert_has_a_unit_test():
    tested = (RULES / "tests" / "engines.yml").read_text()
    alerts = [rule["alert"] for group in engine_metrics.rules()["groups"] for rule in group["rules"] if "alert" in rule]
    assert alerts == ["LLMGWEngineMetricsAbsent"]
    assert f"alertname: {alerts[0]}" in tested


@pytest.mark.parametrize(
    ("engine", "version", "kv_cache"),
    [
        ("vllm", "0.9.2", "vllm:gpu_cache_usage_perc"),
        ("vllm", "0.10.0", "vllm:kv_cache_usage_perc"),
        ("vllm", "", "vllm:kv_cache_usage_perc"),
        ("sglang", "0.5.3", "sglang:token_usage"),
        ("llama.cpp", "0.3.36", None),
    ],
)
def test_the_version_decides_which_names_apply(engine, version, kv_cache):
    names = engine_metrics.names(engine, version)
    assert getattr(names.get(Signal.KV_CACHE_USAGE), "metric", None) == kv_cache
    assert Signal.REQUESTS_WAITING in names and Signal.TOKENS_PER_SECOND in names


def test_an_engine_outside_the_table_has_no_names():
    assert engine_metrics.names("command") == {}
