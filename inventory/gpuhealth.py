"""A GPU's condition: healthy, degraded or failed, moved by the error evidence its agent samples.

The rules are docs/gpus.md's. Evidence arrives with the heartbeat's load
(`protocol.GPULoad`): XID events, and levels (uncorrectable ECC errors, pages
or rows waiting for a reset, a failed remapping). A GPU only ever gets worse
on evidence; the way back is slower on purpose, so a GPU does not flap in and
out of placement:

- failed stays failed until an operator clears it (`clear`);
- degraded goes back to healthy once its agent reports `RECOVERY_SAMPLES`
  consecutive clean samples (`recover`, run by each reconcile pass, reads the
  node's latest load from Redis: an ordinary heartbeat touches no row).

A failed GPU fails the replica holding it, whole, so that placement rebuilds
it elsewhere; the node's other GPUs stay schedulable. Every change is a
compare-and-set update with a node event, so a duplicated heartbeat or pass
records nothing twice.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime

import redis
from django.db import transaction
from django.utils import timezone

from agent import protocol
from inventory.events import change_and_record
from inventory.models import GPU, GPUCondition, NodeEvent
from inventory.replicas import fail_gpu_holders
from livestate import loadstore

log = logging.getLogger(__name__)

# XIDs that mean the GPU cannot be trusted with work until someone looks at it.
FAILING_XIDS = {
    48: "double-bit ECC error",
    64: "row remapping failed",
    79: "fallen off the bus",
    95: "uncontained ECC error",
}
# XIDs that mean it should take no new work for now; what runs on it stays.
DEGRADING_XIDS = {
    63: "row remapping pending",
    74: "NVLink error",
    92: "high single-bit ECC error rate",
    94: "contained ECC error",
}
# Twelve heartbeats at the default 5 s: a minute without any sign of trouble.
RECOVERY_SAMPLES = 12

_RANK = {GPUCondition.HEALTHY: 0, GPUCondition.DEGRADED: 1, GPUCondition.FAILED: 2}
ACTOR = "system"


@dataclass(frozen=True)
class Finding:
    condition: GPUCondition
    reason: str


def judge(sample: protocol.GPULoad) -> Finding | None:
    """The worst condition the sample's evidence calls for, with why; None when it shows none."""
    failing = [f"XID {x} ({FAILING_XIDS[x]})" for x in sorted(set(sample.xids)) if x in FAILING_XIDS]
    if sample.ecc_uncorrected:
        failing.append(f"{sample.ecc_uncorrected} uncorrectable ECC errors")
    if sample.remap_failed:
        failing.append("row remapping failed")
    if failing:
        return Finding(GPUCondition.FAILED, "; ".join(failing))
    degrading = [f"XID {x} ({DEGRADING_XIDS[x]})" for x in sorted(set(sample.xids)) if x in DEGRADING_XIDS]
    if sample.remap_pending:
        degrading.append("rows waiting to be remapped")
    if sample.retired_pages_pending:
        degrading.append("pages waiting to be retired")
    if degrading:
        return Finding(GPUCondition.DEGRADED, "; ".join(degrading))
    return None


def shows_evidence(load: protocol.Load | None) -> bool:
    """Whether a heartbeat's load needs the domain: cheap, so the ordinary heartbeat stays off the database."""
    return load is not None and any(judge(sample) is not None for sample in load.gpus)


def observe(node_id: str, samples: Iterable[protocol.GPULoad], now: datetime | None = None) -> list[int]:
    """Make the node's GPUs as bad as their evidence says; fail the replicas on those now failed.

    A sample whose uuid differs from the stored GPU's is of another card (the
    inventory has not caught up yet) and is left alone. Returns the indices
    whose condition changed.
    """
    findings = {s.index: (s.uuid, found) for s in samples if (found := judge(s)) is not None}
    if not findings:
        return []
    now = now or timezone.now()
    changed, failed = [], []
    with transaction.atomic():
        rows = GPU.objects.filter(node_id=node_id, index__in=findings).values_list("index", "uuid", "condition")
        for index, uuid, old in rows:
            sample_uuid, found = findings[index]
            if sample_uuid and uuid and sample_uuid != uuid:
                continue
            if _RANK[found.condition] <= _RANK[GPUCondition(old)]:
                continue
            if _move(node_id, index, old, found.condition, found.reason, ACTOR, now):
                changed.append(index)
                if found.condition == GPUCondition.FAILED:
                    failed.append((node_id, index))
    if failed:
        fail_gpu_holders(failed, "failed", now)
    return sorted(changed)


def recover(now: datetime | None = None) -> list[tuple[str, int]]:
    """Degraded GPUs whose agent has since sampled RECOVERY_SAMPLES clean ones in a row become healthy.

    Reads each such node's latest fresh load from Redis: a node that stopped
    reporting, or an agent that does not sample GPUs, clears nothing.
    """
    now = now or timezone.now()
    degraded = list(GPU.objects.filter(condition=GPUCondition.DEGRADED).values_list("node_id", "index", "uuid"))
    if not degraded:
        return []
    try:
        loads = loadstore.fetch({node_id for node_id, _, _ in degraded})
    except redis.RedisError as exc:
        log.warning("GPU recovery skipped, the loads are unreadable: %s", exc)
        return []
    recovered = []
    for node_id, index, uuid in degraded:
        stored = loads.get(node_id)
        sample = next((s for s in stored.load.gpus if s.index == index), None) if stored else None
        if sample is None or (sample.uuid and uuid and sample.uuid != uuid):
            continue
        if sample.clean_samples >= RECOVERY_SAMPLES:
            reason = f"{sample.clean_samples} clean samples in a row"
            if _move(node_id, index, GPUCondition.DEGRADED, GPUCondition.HEALTHY, reason, ACTOR, now):
                recovered.append((node_id, index))
    return recovered


class ReasonRequired(ValueError):
    """Clearing a GPU without a reason: the next operator needs to know why."""


def clear(gpu: GPU, actor: str, reason: str, now: datetime | None = None) -> bool:
    """An operator marks a degraded or failed GPU healthy again; False if it already was.

    If its counters still show the fault (a GPU not yet reset), the next
    heartbeat makes it failed again: the evidence wins over the operator.
    """
    reason = reason.strip()
    if not reason:
        raise ReasonRequired("a reason is required")
    old = GPUCondition(gpu.condition)
    if old == GPUCondition.HEALTHY:
        return False
    return _move(gpu.node_id, gpu.index, old, GPUCondition.HEALTHY, reason, actor, now or timezone.now())


def _move(node_id: str, index: int, old: str, new: GPUCondition, reason: str, actor: str, now: datetime) -> bool:
    """Compare-and-set one GPU's condition, with a node event when it changed."""
    return change_and_record(
        GPU.objects.filter(node_id=node_id, index=index, condition=old),
        {
            "condition": new,
            "condition_reason": "" if new == GPUCondition.HEALTHY else reason[:1024],
            "condition_since": now,
        },
        NodeEvent(
            node_id=node_id,
            at=now,
            kind=NodeEvent.Kind.GPU,
            from_state=old,
            to_state=new,
            reason=f"GPU {index}: {reason}",
            actor=actor[:150],
        ),
    )
