"""Proto <-> domain conversion for the servicers. Pure and mechanical, no rules.

Domain enums have the wire enums' integer values (coordinator.domain.states), so enums convert
by value; times are float seconds in the domain and Timestamps on the wire, where 0.0 (never
happened) becomes an unset field.
"""

from __future__ import annotations

from typing import Any

from google.protobuf.timestamp_pb2 import Timestamp

from coordinator.domain.decisions import Fence, Verdict
from coordinator.domain.records import AttemptRecord, ResultRecord, TaskRecord
from coordinator.domain.states import FenceReason, Outcome, TaskState
from coordinator.server import queue_wire
from coordinator.store.types import (
    ClaimResult,
    CommitResult,
    DrainStatus,
    FailResult,
    RenewResult,
    TaskSpec,
)
from coordinator.v1 import admin_pb2, tasks_pb2, types_pb2, worker_pb2


def timestamp(seconds: float) -> Timestamp | None:
    """A Timestamp for ``seconds`` since the epoch; None (unset) for 0."""
    if not seconds:
        return None
    ts = Timestamp()
    ts.FromNanoseconds(round(seconds * 1e9))
    return ts


def task_state(state: TaskState | None) -> types_pb2.TaskState.ValueType:
    """The wire TaskState (UNSPECIFIED for None)."""
    return types_pb2.TaskState.ValueType(int(state) if state is not None else 0)


def outcome(value: Outcome) -> types_pb2.Outcome.ValueType:
    """The wire Outcome."""
    return types_pb2.Outcome.ValueType(int(value))


def reason(value: FenceReason) -> types_pb2.FenceReason.ValueType:
    """The wire FenceReason (NONE is UNSPECIFIED)."""
    return types_pb2.FenceReason.ValueType(int(value))


def fence_to_proto(fence: Fence) -> types_pb2.Fence:
    """The credential as the worker sends it back."""
    return types_pb2.Fence(
        task_id=fence.task_id,
        attempt_id=fence.attempt_id,
        claim_generation=fence.claim_generation,
        scheduler_epoch=fence.scheduler_epoch,
        cancel_generation=fence.cancel_generation,
    )


def task_to_proto(task: TaskRecord) -> types_pb2.Task:
    """A task record on the wire, with its state_version."""
    message = types_pb2.Task(
        task_id=task.task_id,
        revision=task.revision,
        state=task_state(task.state),
        state_version=task.state_version,
        queue=task.queue,
        priority=task.priority,
        input_digest=task.input_digest,
        input=task.input,
        claim_generation=task.claim_generation,
        scheduler_epoch=task.scheduler_epoch,
        attempt=task.attempt,
        attempt_id=task.attempt_id,
        owner_id=task.owner_id,
        cancel_generation=task.cancel_generation,
        result_commit_id=task.result_commit_id,
        result_digest=task.result_digest,
        root_task_id=task.root_task_id,
        parent_task_id=task.parent_task_id,
        thread_key=task.thread_key,
        depends_on=list(task.depends_on),
        requires_review=task.requires_review,
        non_replayable=task.non_replayable,
        created_at=timestamp(task.created_at),
        updated_at=timestamp(task.updated_at),
    )
    queue_wire.fill_queue_fields(message, task)
    return message


def attempt_to_proto(attempt: AttemptRecord) -> types_pb2.Attempt:
    """One attempt on the wire (end UNSPECIFIED while it runs)."""
    return types_pb2.Attempt(
        attempt_id=attempt.attempt_id,
        attempt=attempt.attempt,
        owner_id=attempt.owner_id,
        claim_generation=attempt.claim_generation,
        scheduler_epoch=attempt.scheduler_epoch,
        started_at=timestamp(attempt.started_at),
        ended_at=timestamp(attempt.ended_at),
        end=types_pb2.AttemptEnd.ValueType(int(attempt.end)),
        error_code=attempt.error_code,
        error_message=attempt.error_message,
        error_details=attempt.error_details,
    )


def result_to_proto(result: ResultRecord) -> tasks_pb2.TaskResult:
    """A canonical result on the wire, with the fence of the attempt that committed it."""
    return tasks_pb2.TaskResult(
        task_id=result.task_id,
        revision=result.revision,
        result=result.result,
        result_ref=result.result_ref,
        result_digest=result.result_digest,
        attempt_id=result.attempt_id,
        claim_generation=result.claim_generation,
        scheduler_epoch=result.scheduler_epoch,
        commit_id=result.commit_id,
        owner_id=result.owner_id,
        committed_at=timestamp(result.committed_at),
        evidence=list(result.evidence),
    )


def task_spec(
    request: tasks_pb2.CreateTaskRequest,
    *,
    queue: str,
    input_digest: str,
    thread_key: str = "",
    depends_on: tuple[str, ...] = (),
    retry: tuple[tuple[str, Any], ...] = (),
    not_before: float = 0.0,
    schedule_to_close: float = 0.0,
) -> TaskSpec:
    """The store's TaskSpec for a validated CreateTaskRequest (thread key normalized)."""
    return TaskSpec(
        task_id=request.task_id,
        queue=queue,
        priority=request.priority,
        input=request.input,
        input_digest=input_digest,
        requires_review=request.requires_review,
        non_replayable=request.non_replayable,
        root_task_id=request.root_task_id,
        parent_task_id=request.parent_task_id,
        thread_key=thread_key,
        depends_on=depends_on,
        retry=retry,
        not_before=not_before,
        schedule_to_close=schedule_to_close,
    )


def claim_response(result: ClaimResult) -> worker_pb2.ClaimResponse:
    """ClaimResponse: the fence and the input only for the winner, state_version for anyone."""
    verdict = result.verdict
    response = worker_pb2.ClaimResponse(
        outcome=outcome(verdict.outcome), reason=reason(verdict.reason), message=verdict.message
    )
    task = result.task
    if task is not None:
        response.state_version = task.state_version
        response.task_revision = task.revision
    if result.fence is None or task is None:
        return response
    response.fence.CopyFrom(fence_to_proto(result.fence))
    response.attempt = result.attempt
    response.ttl_seconds = result.ttl
    _set_time(response.lease_expires_at, result.lease_expires_at)
    response.lease_remaining.FromNanoseconds(round(result.lease_remaining * 1e9))
    _set_time(response.claim_deadline, result.deadline)
    response.input_digest = task.input_digest
    response.input = task.input
    response.checkpoint = result.checkpoint
    return response


def renew_response(result: RenewResult) -> worker_pb2.RenewResponse:
    """RenewResponse; the times only when the lease was kept alive."""
    verdict = result.verdict
    return worker_pb2.RenewResponse(
        outcome=outcome(verdict.outcome),
        reason=reason(verdict.reason),
        message=verdict.message,
        ttl_seconds=result.ttl,
        lease_expires_at=timestamp(result.lease_expires_at),
        claim_deadline=timestamp(result.deadline),
    )


def authorize_response(verdict: Verdict) -> worker_pb2.AuthorizeToolResponse:
    """AuthorizeToolResponse from the store's verdict."""
    return worker_pb2.AuthorizeToolResponse(
        outcome=outcome(verdict.outcome), reason=reason(verdict.reason), message=verdict.message
    )


def release_response(verdict: Verdict) -> worker_pb2.ReleaseResponse:
    """ReleaseResponse from the store's verdict."""
    return worker_pb2.ReleaseResponse(
        outcome=outcome(verdict.outcome), reason=reason(verdict.reason), message=verdict.message
    )


def fail_response(result: FailResult) -> worker_pb2.FailResponse:
    """FailResponse; where the task went and when it is eligible again, when accepted."""
    verdict = result.verdict
    return worker_pb2.FailResponse(
        outcome=outcome(verdict.outcome),
        reason=reason(verdict.reason),
        message=verdict.message,
        state=task_state(result.state),
        next_eligible_at=timestamp(result.next_eligible_at),
    )


def commit_response(result: CommitResult) -> worker_pb2.CommitResponse:
    """CommitResponse; the commit id and the task state only when COMMITTED."""
    verdict = result.verdict
    return worker_pb2.CommitResponse(
        outcome=outcome(verdict.outcome),
        reason=reason(verdict.reason),
        message=verdict.message,
        result_commit_id=result.result_commit_id,
        state=task_state(result.state),
    )


def drain_response(status: DrainStatus) -> admin_pb2.DrainStatusResponse:
    """DrainStatusResponse, including the derived ``drained`` flag."""
    return admin_pb2.DrainStatusResponse(
        epoch=status.epoch,
        claims_paused=status.claims_paused,
        active_leases=status.active_leases,
        unknown_effects=status.unknown_effects,
        staged_uncommitted=status.staged_uncommitted,
        drained=status.drained,
        queue=status.queue,
        queue_paused=status.queue_paused,
    )


def _set_time(field: Timestamp, seconds: float) -> None:
    if seconds:
        field.FromNanoseconds(round(seconds * 1e9))
