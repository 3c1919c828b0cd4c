"""Discovery on fixture trees: host, fabrics, storage and weights, engines, GPUs through a stand-in NVML."""

import os
import sys
import threading
import types
from pathlib import Path

import pytest

from agent import config as agent_config
from agent import discovery, procfs, protocol
from agent.discovery import Discoverer, engines, fabrics, gpus, host, inventory_hash, storage

FIXTURES = Path(__file__).parent / "fixtures"
ROOTS = procfs.Roots(proc=FIXTURES / "proc", sys=FIXTURES / "sys", etc=FIXTURES / "etc")


def make_config(**extra) -> agent_config.Config:
    return agent_config.from_mapping({"control_plane": "http://127.0.0.1:1", "join_token": "j", **extra})


def test_host_from_os_release_cpuinfo_and_meminfo():
    found = host.read_host(ROOTS)
    assert (found.os, found.os_version) == ("Debian GNU/Linux", "12")
    assert found.kernel == "6.1.0-28-amd64"
    assert found.cpu_model == "AMD EPYC 9654 96-Core Processor"
    assert found.cpus == 4
    assert found.arch == os.uname().machine
    assert host.memory_total(ROOTS) == 16384000 * 1024


def fabric(name, *hcas, rate=None):
    return agent_config.FabricConfig(name=name, hcas=list(hcas), rate_gbps=rate)


def test_fabric_rate_is_the_slowest_active_port():
    found = fabrics.read_fabrics(
        [fabric("east", "mlx5_0", "mlx5_1"), fabric("west", "mlx5_0", "mlx5_2"), fabric("down", "mlx5_2")], ROOTS.sys
    )
    assert [(f.name, f.hcas, f.rate_gbps) for f in found] == [
        ("east", ["mlx5_0", "mlx5_1"], 100),  # mlx5_1 port 1 is 100 Gb/s
        ("west", ["mlx5_0", "mlx5_2"], 200),  # mlx5_2 is down: it does not count
        ("down", ["mlx5_2"], 0),
    ]


def test_configured_rate_overrides_the_measured_one():
    assert fabrics.read_fabrics([fabric("east", "mlx5_0", rate=400)], ROOTS.sys)[0].rate_gbps == 400


def test_a_malformed_rate_is_skipped(caplog):
    assert fabrics.read_fabrics([fabric("odd", "mlx5_3")], ROOTS.sys)[0].rate_gbps == 0
    assert "malformed" in caplog.text


def test_a_missing_adapter_is_a_start_up_error_and_later_a_warning(caplog):
    with pytest.raises(fabrics.MissingAdapter, match="mlx5_9"):
        fabrics.read_fabrics([fabric("east", "mlx5_0", "mlx5_9")], ROOTS.sys, strict=True)
    assert fabrics.read_fabrics([fabric("east", "mlx5_0", "mlx5_9")], ROOTS.sys)[0].rate_gbps == 200
    assert "mlx5_9" in caplog.text


def test_mounts_and_shared_types():
    mounts = storage.read_mounts(ROOTS.proc)
    assert storage.Mount("/mnt/with space", "xfs") in mounts
    assert storage.mount_of("/mnt/models/llama", mounts) == storage.Mount("/mnt/models", "nfs4")
    assert storage.mount_of("/mnt/models/local/x", mounts) == storage.Mount("/mnt/models/local", "ext4")
    assert storage.mount_of("/mnt/modelsX", mounts) == storage.Mount("/", "ext4")
    assert storage.is_shared("nfs4") and storage.is_shared("fuse.sshfs") and storage.is_shared("lustre")
    assert not storage.is_shared("ext4") and not storage.is_shared("xfs")


def write_models(root: Path) -> None:
    (root / "llama").mkdir(parents=True)
    (root / "llama" / "config.json").write_text("{}")
    (root / "llama" / "model-00001.safetensors").write_bytes(b"x" * 1000)
    (root / "llama" / "model-00002.safetensors").write_bytes(b"x" * 500)
    (root / "org" / "old").mkdir(parents=True)
    (root / "org" / "old" / "config.json").write_text("{}")
    (root / "org" / "old" / "pytorch_model.bin").write_bytes(b"x" * 300)
    (root / "gguf").mkdir()
    (root / "gguf" / "q4.gguf").write_bytes(b"x" * 700)
    (root / "notes").mkdir()
    (root / "notes" / "config.json").write_text("{}")  # a config without weights is not a model
    deep = root / "a" / "b" / "c" / "d" / "e"
    deep.mkdir(parents=True)
    (deep / "too-deep.gguf").write_bytes(b"x")


def test_weights_are_found_with_format_and_size(tmp_path):
    write_models(tmp_path)
    found = {w.path: (w.format, w.size_bytes) for w in storage.scan_weights(str(tmp_path))}
    assert found == {
        str(tmp_path / "llama"): ("safetensors", 1502),
        str(tmp_path / "org" / "old"): ("bin", 302),
        str(tmp_path / "gguf" / "q4.gguf"): ("gguf", 700),
    }


def test_weights_are_bounded_in_count(tmp_path):
    for i in range(30):
        (tmp_path / f"m{i:02}.gguf").write_bytes(b"x")
    assert len(storage.scan_weights(str(tmp_path), limit=10)) == 10


def test_storage_reports_each_filesystem_once(tmp_path):
    write_models(tmp_path / "a")
    (tmp_path / "b").mkdir()
    proc = tmp_path / "proc" / "self"
    proc.mkdir(parents=True)
    (proc / "mountinfo").write_text(f"40 1 0:50 / {tmp_path} rw - nfs4 filer:/export rw\n")
    found_fs, found_weights = storage.Storage(tmp_path / "proc").read([str(tmp_path / "a"), str(tmp_path / "b")])
    assert len(found_fs) == 1
    stats = os.statvfs(tmp_path)
    assert found_fs[0].mount == str(tmp_path) and found_fs[0].fstype == "nfs4" and found_fs[0].shared
    assert found_fs[0].total_bytes == stats.f_blocks * stats.f_frsize
    assert abs(found_fs[0].free_bytes - stats.f_bavail * stats.f_frsize) < 2**30
    assert len(found_weights) == 3


def test_a_hung_model_directory_is_skipped_and_not_piled_onto(tmp_path, monkeypatch, caplog):
    release = threading.Event()
    calls = []

    def hang(model_dir, mounts, limit):
        calls.append(model_dir)
        release.wait(30)
        return storage.Look()

    monkeypatch.setattr(storage, "look_at", hang)
    store = storage.Storage(tmp_path, timeout=0.1)
    assert store.read(["/mnt/hung"]) == ([], [])
    assert store.read(["/mnt/hung"]) == ([], [])
    assert calls == ["/mnt/hung"], "a second look must wait for the first to return"
    assert "did not answer" in caplog.text and "still not answering" in caplog.text
    release.set()
    store.hung["/mnt/hung"].join(5)
    store.read(["/mnt/hung"])
    assert calls == ["/mnt/hung", "/mnt/hung"]


def fake_binary(tmp_path: Path, name: str, script: str) -> str:
    path = tmp_path / name
    path.write_text(f"#!/bin/sh\n{script}\n")
    path.chmod(0o755)
    return str(path)


def test_engine_versions(tmp_path):
    found = engines.probe(
        {
            "vllm": [fake_binary(tmp_path, "vllm", "echo 0.6.3")],
            "llama.cpp": [fake_binary(tmp_path, "llama-server", "echo 'version: 4153 (abc)' >&2")],
            "broken": [fake_binary(tmp_path, "broken", "echo oops; exit 3")],
            "missing": [str(tmp_path / "nothing-here")],
        }
    )
    assert found == {
        "vllm": "0.6.3",
        "llama.cpp": "4153 (abc)",
        "broken": "unknown (exit 3: oops)",
        "missing": engines.NOT_INSTALLED,
    }


def test_an_engine_that_never_answers_times_out(tmp_path):
    assert engines.probe_one([fake_binary(tmp_path, "slow", "exec sleep 30")], timeout=0.2).startswith("unknown")


class FakeNVML(types.ModuleType):
    """Just enough of pynvml for two GPUs: one clean, one with ECC errors, and a foreign process on the first."""

    NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 1
    NVML_VOLATILE_ECC = 0

    class NVMLError(Exception):
        pass

    def __init__(self, processes):
        super().__init__("pynvml")
        self.processes = processes
        self.shut_down = False

    def nvmlInit(self):
        pass

    def nvmlShutdown(self):
        self.shut_down = True

    def nvmlDeviceGetCount(self):
        return 2

    def nvmlDeviceGetHandleByIndex(self, i):
        return i

    def nvmlDeviceGetUUID(self, h):
        return f"GPU-{h}"

    def nvmlDeviceGetName(self, h):
        return b"NVIDIA H100 80GB HBM3"

    def nvmlDeviceGetMemoryInfo(self, h):
        return types.SimpleNamespace(total=80 * 2**30)

    def nvmlDeviceGetTotalEccErrors(self, h, kind, counter):
        return [0, 3][h]

    def nvmlDeviceGetComputeRunningProcesses(self, h):
        return [types.SimpleNamespace(pid=p) for p in self.processes.get(h, [])]

    def nvmlDeviceGetGraphicsRunningProcesses(self, h):
        raise self.NVMLError("not supported")


def test_gpus_with_health(monkeypatch):
    nvml = FakeNVML({0: [100, 4242]})
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    found = gpus.read_gpus(own_pids={100})
    assert [(g.index, g.uuid, g.name, g.memory_bytes, g.ecc_errors) for g in found] == [
        (0, "GPU-0", "NVIDIA H100 80GB HBM3", 80 * 2**30, 0),
        (1, "GPU-1", "NVIDIA H100 80GB HBM3", 80 * 2**30, 3),
    ]
    assert found[0].health == "foreign process: pid 4242"
    assert found[1].health == "3 uncorrectable ECC errors"
    assert nvml.shut_down
    assert gpus.read_gpus(own_pids={100, 4242})[0].health == "ok"


def test_no_nvml_means_no_gpus(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # as if not installed
    assert gpus.read_gpus() == []
    nvml = FakeNVML({})

    def no_driver():
        raise nvml.NVMLError("Driver Not Loaded")

    nvml.nvmlInit = no_driver
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    assert gpus.read_gpus() == []


def test_inventory_and_its_hash(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)
    write_models(tmp_path / "models")
    config = make_config(
        labels={"rack": "r3"},
        model_dirs=[str(tmp_path / "models")],
        fabrics=[{"name": "east", "hcas": ["mlx5_0"]}],
        engines={"vllm": [fake_binary(tmp_path, "vllm", "echo 0.6.3")]},
    )
    discoverer = Discoverer(config, ROOTS)
    inventory = discoverer.discover(strict=True)
    assert inventory.labels == {"rack": "r3"}
    assert inventory.engine_versions == {"vllm": "0.6.3"} and inventory.engines_probed
    assert inventory.weights_scanned and len(inventory.weights) == 3
    assert inventory.fabrics == [protocol.Fabric(name="east", hcas=["mlx5_0"], rate_gbps=200)]
    assert inventory.host.cpus == 4 and inventory.memory_total_bytes == 16384000 * 1024
    assert inventory.mgmt_addr == "127.0.0.1"
    # The hash is stable while nothing changes, and changes when something does.
    assert inventory_hash(discoverer.discover()) == inventory_hash(inventory)
    (tmp_path / "models" / "new.gguf").write_bytes(b"x")
    assert inventory_hash(discoverer.discover()) != inventory_hash(inventory)
    # It is a valid body for the control plane.
    protocol.decode(protocol.encode(inventory), protocol.Inventory)


def test_without_model_dirs_the_node_says_it_never_looked():
    inventory = Discoverer(make_config(engines={}), ROOTS).discover()
    assert not inventory.weights_scanned and inventory.weights == [] and inventory.filesystems == []
    assert inventory.engines_probed and inventory.engine_versions == {}


def test_an_inventory_too_large_for_a_heartbeat_is_trimmed(caplog):
    weights = [protocol.Weights(path="/models/" + f"{i:04}" * 200, size_bytes=1, format="gguf") for i in range(1024)]
    inventory = protocol.Inventory(hostname="h", weights=weights)
    assert len(protocol.encode(inventory)) > protocol.MAX_BODY_BYTES
    trimmed = discovery.fit(inventory)
    assert len(protocol.encode(trimmed)) <= discovery.INVENTORY_BUDGET
    assert trimmed.weights == weights[: len(trimmed.weights)] and len(trimmed.weights) > 300
    assert "reporting" in caplog.text
    small = protocol.Inventory(hostname="h", weights=weights[:3])
    assert discovery.fit(small) is small
