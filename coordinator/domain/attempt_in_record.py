"""The attempt a task record holds (schema 3, ``TaskRecord.attempt_in_record``; pure).

A claim writes no attempt key and a commit leaves the committed attempt in the task record;
``recorded_attempt`` reads it back as the ``AttemptRecord`` its key would hold
(store/transition.py gives it that key when anything else moves the task).
"""

from __future__ import annotations

from coordinator.domain.records import AttemptRecord, TaskRecord
from coordinator.domain.states import AttemptEnd, TaskState


def recorded_attempt(task: TaskRecord) -> AttemptRecord | None:
    """The current attempt as ``task``'s record describes it (``attempt_in_record``), or None
    if the attempt has a key of its own (or the task has had no attempt)."""
    if not task.attempt_in_record or not task.attempt_id:
        return None
    running = task.state is TaskState.CLAIMED
    return AttemptRecord(
        task_id=task.task_id,
        attempt_id=task.attempt_id,
        attempt=task.attempt,
        owner_id=task.owner_id,
        revision=task.revision,
        input_digest=task.input_digest,
        scheduler_epoch=task.scheduler_epoch,
        ttl=task.attempt_ttl,
        started_at=task.attempt_started_at,
        claim_generation=task.claim_generation,
        end=AttemptEnd.RUNNING if running else AttemptEnd.COMMITTED,
        ended_at=0.0 if running else task.updated_at,
    )
