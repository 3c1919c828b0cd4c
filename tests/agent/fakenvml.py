"""A stand-in for pynvml with GPUs whose figures and faults a test sets: no GPU or driver is needed.

Only the calls the agent makes are here, with pynvml's names, constants and
return shapes; a test installs it as `sys.modules["pynvml"]`.
"""

from __future__ import annotations

import types
from dataclasses import dataclass, field


@dataclass
class FakeGPU:
    uuid: str
    name: str = "NVIDIA H100 80GB HBM3"
    total: int = 80 * 2**30
    used: int = 0
    utilization: int = 0
    temperature: int = 35
    power_mw: int | None = 70_000
    ecc_uncorrected: int = 0
    retired_pending: bool = False
    remap_pending: bool = False
    remap_failed: bool = False
    processes: list[int] = field(default_factory=list)


class FakeNVML(types.ModuleType):
    NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 1
    NVML_VOLATILE_ECC = 0
    NVML_TEMPERATURE_GPU = 0
    NVML_ERROR_NOT_SUPPORTED = 3
    NVML_ERROR_TIMEOUT = 10
    nvmlEventTypeXidCriticalError = 0x8

    class NVMLError(Exception):
        def __init__(self, value: int):
            super().__init__(f"NVML error {value}")
            self.value = value

    def __init__(self, gpus: list[FakeGPU]):
        super().__init__("pynvml")
        self.gpus = gpus
        self.xids: list[tuple[int, int]] = []  # (GPU index, XID) queued for the event set
        self.initialised = 0

    def xid(self, index: int, code: int) -> None:
        """The driver reports an XID on a GPU."""
        self.xids.append((index, code))

    def nvmlInit(self):
        self.initialised += 1

    def nvmlShutdown(self):
        self.initialised -= 1

    def nvmlDeviceGetCount(self):
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, i):
        return i

    def nvmlDeviceGetIndex(self, handle):
        return handle

    def nvmlDeviceGetUUID(self, h):
        return self.gpus[h].uuid

    def nvmlDeviceGetName(self, h):
        return self.gpus[h].name.encode()

    def nvmlDeviceGetMemoryInfo(self, h):
        gpu = self.gpus[h]
        return types.SimpleNamespace(total=gpu.total, used=gpu.used, free=gpu.total - gpu.used)

    def nvmlDeviceGetUtilizationRates(self, h):
        return types.SimpleNamespace(gpu=self.gpus[h].utilization, memory=0)

    def nvmlDeviceGetTemperature(self, h, sensor):
        return self.gpus[h].temperature

    def nvmlDeviceGetPowerUsage(self, h):
        if self.gpus[h].power_mw is None:
            raise self.NVMLError(self.NVML_ERROR_NOT_SUPPORTED)
        return self.gpus[h].power_mw

    def nvmlDeviceGetTotalEccErrors(self, h, kind, counter):
        return self.gpus[h].ecc_uncorrected

    def nvmlDeviceGetRetiredPagesPendingStatus(self, h):
        return int(self.gpus[h].retired_pending)

    def nvmlDeviceGetRemappedRows(self, h):
        gpu = self.gpus[h]
        return (0, 0, int(gpu.remap_pending), int(gpu.remap_failed))

    def nvmlDeviceGetComputeRunningProcesses(self, h):
        return [types.SimpleNamespace(pid=p) for p in self.gpus[h].processes]

    def nvmlDeviceGetGraphicsRunningProcesses(self, h):
        raise self.NVMLError(self.NVML_ERROR_NOT_SUPPORTED)

    def nvmlEventSetCreate(self):
        return "event-set"

    def nvmlDeviceRegisterEvents(self, handle, types_, event_set):
        pass

    def nvmlEventSetWait_v2(self, event_set, timeout_ms):
        if not self.xids:
            raise self.NVMLError(self.NVML_ERROR_TIMEOUT)
        index, code = self.xids.pop(0)
        return types.SimpleNamespace(device=index, eventType=self.nvmlEventTypeXidCriticalError, eventData=code)

    def nvmlEventSetFree(self, event_set):
        pass
