"""Review rules: a report is not an acceptance (pure, no I/O).

A task created with ``requires_review`` goes to REVIEW on commit. Only a reviewer other than
the principal whose attempt committed may accept or reject it, and only for the revision it
looked at: a decision about an older revision never applies to a newer one.
"""

from __future__ import annotations

from enum import Enum

from coordinator.domain.records import ResultRecord, TaskRecord
from coordinator.domain.states import TaskState
from coordinator.errors import FailedPrecondition, PermissionDenied


class ReviewDecision(Enum):
    """What a review call leads to once every check passed."""

    ACCEPT = "accept"
    REJECT = "reject"


class ReviewAction(Enum):
    """What the store does with an admissible review call."""

    APPLY = "apply"
    # The same acceptance already landed (a retry after a lost response): no second write.
    ALREADY_APPLIED = "already_applied"


def check_review(
    task: TaskRecord,
    result: ResultRecord | None,
    *,
    decision: ReviewDecision,
    revision: int,
    reviewer: str,
) -> ReviewAction:
    """Whether ``reviewer`` may ``decision`` revision ``revision`` of ``task``; raises if not.

    ``result`` is the canonical result of the task's current revision (None if it has none).
    Errors: FAILED_PRECONDITION for a task that needs no review, an old revision (both named) or
    a task not in REVIEW; PERMISSION_DENIED when the reviewer executed the revision.
    """
    verb = decision.value
    if not task.requires_review:
        raise FailedPrecondition(
            f"task {task.task_id!r} was not created with requires_review; there is nothing to "
            f"{verb}"
        )
    if revision != task.revision:
        raise FailedPrecondition(
            f"cannot {verb} revision {revision} of task {task.task_id!r}: the task is at revision "
            f"{task.revision}; a review of revision {revision} does not apply to revision "
            f"{task.revision}"
        )
    if result is not None and result.owner_id == reviewer:
        raise PermissionDenied(
            f"{reviewer!r} committed revision {revision} of task {task.task_id!r} (attempt "
            f"{result.attempt_id}); the reviewer must be another principal"
        )
    if decision is ReviewDecision.ACCEPT and task.state is TaskState.DONE and result is not None:
        return ReviewAction.ALREADY_APPLIED
    if task.state is not TaskState.REVIEW:
        raise FailedPrecondition(
            f"task {task.task_id!r} is {task.state.name}; only a task in REVIEW can be {verb}ed"
        )
    if result is None:
        raise FailedPrecondition(
            f"task {task.task_id!r} is in REVIEW but revision {task.revision} has no canonical "
            "result; run `coordinator doctor`"
        )
    return ReviewAction.APPLY
