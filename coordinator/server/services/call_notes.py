"""What a worker call's log line says of its fence and verdict (one line per call:
server/interceptors/call_log.py), shared by the worker service and its claim batches."""

from __future__ import annotations

from contextlib import AbstractContextManager

from coordinator.domain.decisions import Fence, Verdict
from coordinator.logging import bound, note
from coordinator.store import ClaimResult


def bound_fence(fence: Fence, principal: str) -> AbstractContextManager[None]:
    """Bind the fence's task_id, attempt, generation and epoch to the call's log lines."""
    return bound(**fence_fields(fence), principal=principal)


def fence_fields(fence: Fence) -> dict[str, object]:
    """The fence as the call log names it (task, attempt, generation, epoch)."""
    return {
        "task_id": fence.task_id,
        "attempt": fence.attempt_id,
        "generation": fence.claim_generation,
        "epoch": fence.scheduler_epoch,
    }


def note_verdict(verdict: Verdict, **extra: object) -> None:
    """The call's line says whether the acceptance point accepted, with outcome and reason."""
    note(
        accepted=verdict.accepted,
        outcome=verdict.outcome.name,
        reason=verdict.reason.name,
        detail=verdict.message or None,
        **extra,
    )


def note_claim(result: ClaimResult) -> None:
    fence = result.fence
    if fence is None:
        note_verdict(result.verdict)
        return
    # The winner's fence exists only now: the call's line carries all four fields.
    note(**fence_fields(fence))
    note_verdict(result.verdict, ttl=result.ttl)
