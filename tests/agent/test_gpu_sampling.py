"""The agent's GPU sampler over a stand-in NVML: figures, XIDs kept until delivered, the clean streak."""

from __future__ import annotations

import sys

import pytest

from agent import protocol
from agent.discovery.gpus import GPUSampler
from tests.agent.fakenvml import FakeGPU, FakeNVML


@pytest.fixture
def nvml(monkeypatch) -> FakeNVML:
    fake = FakeNVML([FakeGPU("GPU-0"), FakeGPU("GPU-1")])
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    return fake


def test_each_gpu_is_measured(nvml):
    nvml.gpus[0].utilization, nvml.gpus[0].used, nvml.gpus[0].temperature = 87, 60 * 2**30, 71
    nvml.gpus[0].power_mw = 612_500
    nvml.gpus[1].power_mw = None  # a board that cannot say

    first, second = GPUSampler().sample()

    assert first == protocol.GPULoad(
        index=0,
        uuid="GPU-0",
        utilization_percent=87.0,
        memory_used_bytes=60 * 2**30,
        temperature_celsius=71.0,
        power_watts=612.5,
        clean_samples=1,
    )
    assert second.power_watts is None and second.utilization_percent == 0.0


def test_an_xid_is_sent_until_a_heartbeat_carrying_it_is_answered(nvml):
    sampler = GPUSampler()
    sampler.sample()
    nvml.xid(1, 79)

    unsent = sampler.sample()
    assert unsent[1].xids == [79] and unsent[0].xids == []
    again = sampler.sample()  # that heartbeat failed: the next one carries the XID still
    assert again[1].xids == [79]
    sampler.acknowledge(again)
    assert sampler.sample()[1].xids == []


def test_the_clean_streak_restarts_at_each_sign_of_trouble(nvml):
    sampler = GPUSampler()
    assert [sampler.sample()[0].clean_samples for _ in range(3)] == [1, 2, 3]
    nvml.xid(0, 94)
    assert sampler.sample()[0].clean_samples == 0
    assert sampler.sample()[0].clean_samples == 1, "an XID still waiting to be sent is no new trouble"
    nvml.gpus[0].remap_pending = True
    assert [sampler.sample()[0].clean_samples for _ in range(2)] == [0, 0], "a level stays trouble while it lasts"
    nvml.gpus[0].remap_pending = False
    assert sampler.sample()[0].clean_samples == 1


def test_levels_are_reported(nvml):
    nvml.gpus[1].ecc_uncorrected, nvml.gpus[1].retired_pending, nvml.gpus[1].remap_failed = 2, True, True
    sample = GPUSampler().sample()[1]
    assert (sample.ecc_uncorrected, sample.retired_pages_pending, sample.remap_pending, sample.remap_failed) == (
        2,
        True,
        False,
        True,
    )


def test_an_xid_storm_keeps_the_newest(nvml):
    sampler = GPUSampler()
    for code in range(100):
        nvml.xid(0, code)
    assert sampler.sample()[0].xids == list(range(100 - protocol.MAX_XIDS, 100))


def test_without_nvml_nothing_is_sampled(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)
    assert GPUSampler().sample() == []


def test_without_a_driver_nvml_is_not_looked_for_at_every_sample(nvml):
    tries = []

    def no_driver():
        tries.append(1)
        raise nvml.NVMLError(9)

    nvml.nvmlInit = no_driver
    sampler = GPUSampler()
    assert [sampler.sample() for _ in range(5)] == [[]] * 5
    assert len(tries) == 1


def test_nvml_failing_mid_sample_is_opened_again(nvml):
    sampler = GPUSampler()
    sampler.RETRY_EVERY = 0.0
    broken = nvml.nvmlDeviceGetUUID
    nvml.nvmlDeviceGetUUID = lambda h: (_ for _ in ()).throw(nvml.NVMLError(15))
    assert sampler.sample() == []
    assert nvml.initialised == 0, "NVML left open after it failed"
    nvml.nvmlDeviceGetUUID = broken
    assert len(sampler.sample()) == 2
    sampler.close()
    assert nvml.initialised == 0
