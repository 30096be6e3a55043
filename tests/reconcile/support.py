"""Helpers of the owned-reconciliation store tests."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from coordinator.domain.decisions import ClaimLimits, Fence
from coordinator.domain.digests import digest_of
from coordinator.domain.effects import EffectState
from coordinator.domain.records import EventRecord
from coordinator.domain.states import Op, Outcome
from coordinator.store import Store, TaskSpec
from coordinator.store.effects.effect import PrepareResult, RecordResult
from tests.store.support import LIMITS, claim, events

X = digest_of(b"payload X")
TIMEOUT = 60.0


def limits(*, handoffs: int = 1, timeout: float = TIMEOUT) -> ClaimLimits:
    """The store tests' limits with a short reconcile timeout (on the ManualClock)."""
    return replace(LIMITS, reconcile_timeout=timeout, reconcile_handoffs=handoffs)


def new_task(store: Store, task_id: str = "t1", *, non_replayable: bool = False) -> None:
    spec = TaskSpec(task_id=task_id, input=b"input", non_replayable=non_replayable)
    store.tasks.create(spec, by="pm")


def prepare(store: Store, fence: Fence, *, principal: str = "w1") -> PrepareResult:
    return store.effects.prepare(
        fence, principal=principal, node_id="notify", effect_slot="email", payload_digest=X
    )


def record(
    store: Store,
    fence: Fence,
    eid: str,
    state: EffectState,
    *,
    principal: str = "w1",
    ref: str = "",
    owner: str = "",
) -> RecordResult:
    return store.effects.record(
        fence,
        principal=principal,
        effect_id=eid,
        state=state,
        external_ref=ref,
        etag="",
        reconcile_principal=owner,
    )


def unknown(
    store: Store, task_id: str = "t1", *, principal: str = "w1", owner: str = ""
) -> tuple[Fence, str]:
    """Create and claim ``task_id``, prepare its effect and record it UNKNOWN."""
    new_task(store, task_id)
    fence = claim(store, task_id, principal=principal)
    prepared = prepare(store, fence, principal=principal)
    assert prepared.effect is not None
    eid = prepared.effect.effect_id
    result = record(store, fence, eid, EffectState.UNKNOWN, principal=principal, owner=owner)
    assert result.verdict.outcome is Outcome.OK, result.verdict
    return fence, eid


def release(store: Store, fence: Fence, principal: str = "w1") -> None:
    verdict = store.acceptance.release(fence, principal=principal, reason="gave up")
    assert verdict.outcome is Outcome.OK, verdict


def ops_of(store: Store, etcd_client: Any, task_id: str, op: Op) -> list[EventRecord]:
    """The task's events of one op."""
    return [e for e in events(store, etcd_client, task_id) if e.op is op]


def escalations(store: Store, via: str) -> float:
    """coordinator_effect_reconcile_escalations_total{via} of ``store``."""
    value = store.ctx.metrics.registry.get_sample_value(
        "coordinator_effect_reconcile_escalations_total", {"via": via}
    )
    return value or 0.0


def reconcile_keys(store: Store, etcd_client: Any) -> list[str]:
    prefix = store.ctx.keys.reconcile_prefix()
    return sorted(meta.key.decode() for _, meta in etcd_client.get_prefix(prefix))
