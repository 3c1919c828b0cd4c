"""GPUs through NVML, when the library and a driver are present; none otherwise.

A GPU is healthy when it has no uncorrectable ECC errors and nothing but our own
engines runs on it: a process we did not start holds memory that placement counts on.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Set

from agent import protocol

log = logging.getLogger("agent.discovery")


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


def _gpu(nvml, index: int, own_pids: Set[int]) -> protocol.GPU:
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


def _optional(nvml, call):
    """A reading some boards do not support (ECC on consumer cards): None instead of failing the GPU."""
    try:
        return call()
    except nvml.NVMLError:
        return None


def _text(value) -> str:
    return (value.decode() if isinstance(value, bytes) else str(value))[: protocol.MAX_TEXT]
