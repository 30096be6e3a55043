"""What a producer or an operator reads of a task: the task, its attempts, its canonical result,
and the retry policy a create sets. Frozen dataclasses built from the wire (``from_proto``).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Self

from coordinator.domain.states import AttemptEnd, DeadLetterReason, TaskState
from coordinator.sdk._duration import DurationField
from coordinator.sdk.types import timestamp
from coordinator.v1 import tasks_pb2, types_pb2


@dataclass(frozen=True)
class AttemptInfo:
    """One attempt of a task, as the coordinator recorded it."""

    attempt_id: str
    attempt: int
    owner_id: str
    claim_generation: int
    scheduler_epoch: int
    started_at: datetime | None
    ended_at: datetime | None
    end: AttemptEnd
    # The error its holder reported (end FAILED).
    error_code: str = ""
    error_message: str = ""
    # Bytes of the checkpoint kept with it (its own, or the one it was handed).
    checkpoint_size: int = 0

    @classmethod
    def from_proto(cls, msg: types_pb2.Attempt) -> Self:
        """Build from the wire message."""
        return cls(
            attempt_id=msg.attempt_id,
            attempt=msg.attempt,
            owner_id=msg.owner_id,
            claim_generation=msg.claim_generation,
            scheduler_epoch=msg.scheduler_epoch,
            started_at=timestamp(msg.started_at),
            ended_at=timestamp(msg.ended_at),
            end=AttemptEnd(msg.end),
            error_code=msg.error_code,
            error_message=msg.error_message,
            checkpoint_size=msg.checkpoint_size,
        )


@dataclass(frozen=True)
class TaskRetryPolicy:
    """A task's retry policy (None fields: the queue's, else the server's default)."""

    max_attempts: int | None = None
    # Durations take seconds too (sdk/_duration.py).
    initial_backoff: DurationField[timedelta | None] = DurationField(None)
    backoff_multiplier: float | None = None
    max_backoff: DurationField[timedelta | None] = DurationField(None)
    non_retryable_errors: tuple[str, ...] = ()
    # Each retry's wait lengthened by up to this fraction of itself (0 to 1).
    backoff_jitter: float | None = None

    def to_proto(self) -> types_pb2.RetryPolicy:
        """The wire message, with only the fields set here."""
        message = types_pb2.RetryPolicy(non_retryable_errors=list(self.non_retryable_errors))
        if self.max_attempts is not None:
            message.max_attempts = self.max_attempts
        if self.backoff_multiplier is not None:
            message.backoff_multiplier = self.backoff_multiplier
        if self.initial_backoff is not None:
            message.initial_backoff.FromTimedelta(self.initial_backoff)
        if self.max_backoff is not None:
            message.max_backoff.FromTimedelta(self.max_backoff)
        if self.backoff_jitter is not None:
            message.backoff_jitter = self.backoff_jitter
        return message

    @classmethod
    def from_proto(cls, msg: types_pb2.RetryPolicy) -> Self:
        """Build from the wire message (a task's resolved policy sets every field)."""
        return cls(
            max_attempts=msg.max_attempts,
            initial_backoff=msg.initial_backoff.ToTimedelta(),
            backoff_multiplier=msg.backoff_multiplier,
            max_backoff=msg.max_backoff.ToTimedelta(),
            non_retryable_errors=tuple(msg.non_retryable_errors),
            backoff_jitter=msg.backoff_jitter,
        )


@dataclass(frozen=True)
class TaskInfo:
    """A task as the coordinator stores it (plus its attempts, when read with ``get_task``)."""

    task_id: str
    queue: str
    state: TaskState
    revision: int
    # The task key's mod_revision: pass it as ``expected_state_version`` to claim conditionally.
    state_version: int
    priority: int
    input: bytes
    input_digest: str
    claim_generation: int
    scheduler_epoch: int
    attempt: int
    attempt_id: str
    owner_id: str
    cancel_generation: int
    result_commit_id: str
    result_digest: str
    depends_on: tuple[str, ...]
    requires_review: bool
    non_replayable: bool
    created_at: datetime | None
    updated_at: datetime | None
    attempts: tuple[AttemptInfo, ...] = ()
    # Lineage: the tree the task belongs to and its canonical thread.
    root_task_id: str = ""
    parent_task_id: str = ""
    thread_key: str = ""
    # The work-queue view: the resolved retry policy, attempts counted against it, when a
    # DELAYED task becomes READY, what ended the last attempt, and why a FAILED task is.
    retry_policy: TaskRetryPolicy = TaskRetryPolicy()
    attempts_counted: int = 0
    next_eligible_at: datetime | None = None
    last_error: str = ""
    dead_letter_reason: DeadLetterReason = DeadLetterReason.NONE
    # created_at + schedule_to_close, if it has one.
    deadline: datetime | None = None
    # Bytes of the checkpoint its next attempt resumes from (get_task); None where the answer
    # did not say (list_tasks and the other calls that read no attempt).
    checkpoint_size: int | None = None
    # While WAITING: its FAILED or CANCELLED upstreams (blocked until retried and DONE); and
    # when its deadline passed while it waited (overdue: not failed, the deadline is waived).
    blocked_by: tuple[str, ...] = ()
    overdue_at: datetime | None = None

    @classmethod
    def from_proto(cls, msg: types_pb2.Task, attempts: tuple[types_pb2.Attempt, ...] = ()) -> Self:
        """Build from the wire task and, optionally, its attempts (oldest first)."""
        return cls(
            task_id=msg.task_id,
            queue=msg.queue,
            state=TaskState(msg.state),
            revision=msg.revision,
            state_version=msg.state_version,
            priority=msg.priority,
            input=msg.input,
            input_digest=msg.input_digest,
            claim_generation=msg.claim_generation,
            scheduler_epoch=msg.scheduler_epoch,
            attempt=msg.attempt,
            attempt_id=msg.attempt_id,
            owner_id=msg.owner_id,
            cancel_generation=msg.cancel_generation,
            result_commit_id=msg.result_commit_id,
            result_digest=msg.result_digest,
            depends_on=tuple(msg.depends_on),
            requires_review=msg.requires_review,
            non_replayable=msg.non_replayable,
            created_at=timestamp(msg.created_at),
            updated_at=timestamp(msg.updated_at),
            attempts=tuple(AttemptInfo.from_proto(a) for a in attempts),
            root_task_id=msg.root_task_id,
            parent_task_id=msg.parent_task_id,
            thread_key=msg.thread_key,
            retry_policy=TaskRetryPolicy.from_proto(msg.retry_policy),
            attempts_counted=msg.attempts_counted,
            next_eligible_at=timestamp(msg.next_eligible_at),
            last_error=msg.last_error,
            dead_letter_reason=DeadLetterReason(msg.dead_letter_reason),
            deadline=timestamp(msg.deadline),
            checkpoint_size=msg.checkpoint_size if msg.HasField("checkpoint_size") else None,
            blocked_by=tuple(msg.blocked_by),
            overdue_at=timestamp(msg.overdue_at),
        )


@dataclass(frozen=True)
class ResultInfo:
    """The canonical result of one task revision, as its commit wrote it (``get_result``)."""

    task_id: str
    revision: int
    # The payload: inline bytes, a reference to where the worker stored it, or both.
    result: bytes
    result_ref: str
    result_digest: str
    # The attempt that committed it, and its fence.
    attempt_id: str
    claim_generation: int
    scheduler_epoch: int
    # "{attempt_id}@{claim_generation}": the task's result_commit_id while this is its revision.
    commit_id: str
    # The principal whose attempt committed it.
    owner_id: str
    committed_at: datetime | None
    # What the commit cited: managed job ids and their log refs.
    evidence: tuple[str, ...]

    @classmethod
    def from_proto(cls, msg: tasks_pb2.TaskResult) -> Self:
        """Build from the wire message."""
        return cls(
            task_id=msg.task_id,
            revision=msg.revision,
            result=msg.result,
            result_ref=msg.result_ref,
            result_digest=msg.result_digest,
            attempt_id=msg.attempt_id,
            claim_generation=msg.claim_generation,
            scheduler_epoch=msg.scheduler_epoch,
            commit_id=msg.commit_id,
            owner_id=msg.owner_id,
            committed_at=timestamp(msg.committed_at),
            evidence=tuple(msg.evidence),
        )
