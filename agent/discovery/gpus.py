"""GPUs through NVML, when the library and a driver are present; none otherwise.

Discovery (`read_gpus`) lists them for the inventory. A GPU is healthy when it has
no uncorrectable ECC errors and nothing but our own engines runs on it: a process
we did not start holds memory that placement counts on. The sampler (`GPUSampler`)
measures each one between heartbeats and collects the error evidence the control
plane judges it by (docs/gpus.md).
"""

from __future__ import annotations

import contextlib
import logging
import re
import threading
import time
from collections.abc import Callable, Set
from typing import Any, TypeVar, get_args

from agent import protocol

log = logging.getLogger("agent.discovery")
_UUID = re.compile(get_args(protocol.GPUUuid)[1].pattern)
T = TypeVar("T")
# pynvml ships no types: the module, its device handles and its event sets are read as Any.
Nvml = Any


def read_gpus(own_pids: Set[int] = frozenset()) -> list[protocol.GPU]:
    try:
        import pynvml
    except ImportError:
        return []
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        # No driver or no device: a CPU node, not an error.
        log.debug("NVML unavailable: %s", exc)
        return []
    try:
        return [_gpu(pynvml, i, own_pids) for i in range(min(pynvml.nvmlDeviceGetCount(), protocol.MAX_GPUS))]
    except pynvml.NVMLError as exc:
        log.warning("NVML failed while listing GPUs: %s", exc)
        return []
    finally:
        with contextlib.suppress(pynvml.NVMLError):
            pynvml.nvmlShutdown()


def _gpu(nvml: Nvml, index: int, own_pids: Set[int]) -> protocol.GPU:
    handle = nvml.nvmlDeviceGetHandleByIndex(index)
    ecc = _optional(
        nvml,
        lambda: nvml.nvmlDeviceGetTotalEccErrors(
            handle, nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, nvml.NVML_VOLATILE_ECC
        ),
    )
    processes = [
        *(_optional(nvml, lambda: nvml.nvmlDeviceGetComputeRunningProcesses(handle)) or []),
        *(_optional(nvml, lambda: nvml.nvmlDeviceGetGraphicsRunningProcesses(handle)) or []),
    ]
    foreign = sorted({p.pid for p in processes} - set(own_pids))
    if ecc:
        health = f"{ecc} uncorrectable ECC errors"
    elif foreign:
        health = "foreign process: pid " + ", ".join(str(pid) for pid in foreign[:8])
    else:
        health = "ok"
    return protocol.GPU(
        index=index,
        uuid=_text(nvml.nvmlDeviceGetUUID(handle)),
        name=_text(nvml.nvmlDeviceGetName(handle)),
        memory_bytes=int(nvml.nvmlDeviceGetMemoryInfo(handle).total),
        ecc_errors=min(int(ecc or 0), 1_000_000),
        health=health,
    )


def _optional(nvml: Nvml, call: Callable[[], T]) -> T | None:
    """A reading some boards do not support (ECC on consumer cards): None instead of failing the GPU."""
    try:
        return call()
    except nvml.NVMLError:
        return None


def _text(value: bytes | str) -> str:
    return (value.decode() if isinstance(value, bytes) else str(value))[: protocol.MAX_TEXT]


class GPUSampler:
    """Samples every GPU between heartbeats: utilisation, memory, temperature, power and error evidence.

    NVML stays initialised while the sampler lives (init and shutdown are
    reference-counted, so discovery's own calls do not end it), and one event
    set listens for XID errors on every GPU. XIDs wait in `pending` until a
    heartbeat carrying them is answered (`acknowledge`), so a beat that fails
    loses none; the clean streak is what the control plane clears a degraded
    GPU by (docs/gpus.md). Without NVML it samples nothing.
    """

    # Without NVML (a CPU node, no driver) it is looked for again this often, not at every sample.
    RETRY_EVERY = 60.0

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._retry_at = float("-inf")
        self._nvml: Any = None
        self._events: Any = None
        self._handles: list[Any] = []
        self.pending: dict[int, list[int]] = {}
        self.clean: dict[int, int] = {}

    def _open(self) -> bool:
        if self._nvml is not None:
            return True
        if time.monotonic() < self._retry_at:
            return False
        self._retry_at = time.monotonic() + self.RETRY_EVERY
        try:
            import pynvml
        except ImportError:
            return False
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as exc:
            log.debug("NVML unavailable for sampling: %s", exc)
            return False
        try:
            count = min(pynvml.nvmlDeviceGetCount(), protocol.MAX_GPUS)
            self._handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
        except pynvml.NVMLError as exc:
            log.warning("NVML failed while listing GPUs to sample: %s", exc)
            with contextlib.suppress(pynvml.NVMLError):
                pynvml.nvmlShutdown()
            return False
        self._nvml = pynvml
        self._events = self._listen(pynvml)
        return True

    def _listen(self, nvml: Nvml) -> Any:
        """An event set for critical XIDs on every GPU that supports it; None where none does."""
        try:
            events = nvml.nvmlEventSetCreate()
        except nvml.NVMLError as exc:
            log.info("XID events unavailable: %s", exc)
            return None
        for index, handle in enumerate(self._handles):
            try:
                nvml.nvmlDeviceRegisterEvents(handle, nvml.nvmlEventTypeXidCriticalError, events)
            except nvml.NVMLError as exc:
                log.info("XID events unavailable on GPU %d: %s", index, exc)
        return events

    def close(self) -> None:
        if self._nvml is None:
            return
        nvml, self._nvml = self._nvml, None
        with contextlib.suppress(nvml.NVMLError):
            if self._events is not None:
                nvml.nvmlEventSetFree(self._events)
            nvml.nvmlShutdown()

    def sample(self) -> list[protocol.GPULoad]:
        with self._lock:
            if not self._open():
                return []
            nvml = self._nvml
            try:
                seen = self._drain_xids(nvml)
                return [
                    self._sample(nvml, index, handle, seen.get(index, [])) for index, handle in enumerate(self._handles)
                ]
            except nvml.NVMLError as exc:
                # A GPU that fell off the bus can take NVML with it: start afresh next time.
                log.warning("NVML failed while sampling GPUs: %s", exc)
                self.close()
                return []

    def acknowledge(self, sent: list[protocol.GPULoad]) -> None:
        """The control plane answered a heartbeat carrying these samples: their XIDs are delivered."""
        with self._lock:
            for gpu in sent:
                waiting = self.pending.get(gpu.index, [])
                for xid in gpu.xids:
                    if xid in waiting:
                        waiting.remove(xid)

    def _drain_xids(self, nvml: Nvml) -> dict[int, list[int]]:
        """Every XID NVML has queued since the last sample, by GPU index, without waiting."""
        seen: dict[int, list[int]] = {}
        if self._events is None:
            return seen
        while True:
            try:
                event = nvml.nvmlEventSetWait_v2(self._events, 0)
            except nvml.NVMLError as exc:
                if getattr(exc, "value", None) != nvml.NVML_ERROR_TIMEOUT:
                    log.warning("reading XID events failed: %s", exc)
                return seen
            if event.eventType & nvml.nvmlEventTypeXidCriticalError:
                seen.setdefault(nvml.nvmlDeviceGetIndex(event.device), []).append(int(event.eventData))

    def _sample(self, nvml: Nvml, index: int, handle: Any, xids: list[int]) -> protocol.GPULoad:
        waiting = self.pending.setdefault(index, [])
        # The oldest are dropped if a storm outruns the heartbeats: the newest say most about now.
        waiting[:] = (waiting + xids)[-protocol.MAX_XIDS :]
        memory = _optional(nvml, lambda: nvml.nvmlDeviceGetMemoryInfo(handle))
        utilization = _optional(nvml, lambda: nvml.nvmlDeviceGetUtilizationRates(handle))
        power_mw = _optional(nvml, lambda: nvml.nvmlDeviceGetPowerUsage(handle))
        temperature = _optional(nvml, lambda: nvml.nvmlDeviceGetTemperature(handle, nvml.NVML_TEMPERATURE_GPU))
        ecc = _optional(
            nvml,
            lambda: nvml.nvmlDeviceGetTotalEccErrors(
                handle, nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, nvml.NVML_VOLATILE_ECC
            ),
        )
        retired = _optional(nvml, lambda: nvml.nvmlDeviceGetRetiredPagesPendingStatus(handle))
        remapped = _optional(nvml, lambda: nvml.nvmlDeviceGetRemappedRows(handle))
        uuid = _text(nvml.nvmlDeviceGetUUID(handle))
        sample = protocol.GPULoad(
            index=index,
            # A uuid the protocol would refuse would make every heartbeat refused: better none.
            uuid=uuid if _UUID.fullmatch(uuid) else "",
            utilization_percent=min(max(float(utilization.gpu), 0.0), 100.0) if utilization is not None else None,
            memory_used_bytes=min(int(memory.used), protocol.MAX_COUNT) if memory is not None else None,
            temperature_celsius=float(temperature) if temperature is not None else None,
            power_watts=power_mw / 1000 if power_mw is not None else None,
            xids=list(waiting),
            ecc_uncorrected=min(int(ecc or 0), 1_000_000),
            retired_pages_pending=bool(retired),
            remap_pending=bool(remapped and remapped[2]),
            remap_failed=bool(remapped and remapped[3]),
        )
        troubled = bool(xids) or sample.ecc_uncorrected or sample.retired_pages_pending
        troubled = troubled or sample.remap_pending or sample.remap_failed
        self.clean[index] = 0 if troubled else min(self.clean.get(index, 0) + 1, 1_000_000)
        sample.clean_samples = self.clean[index]
        return sample
