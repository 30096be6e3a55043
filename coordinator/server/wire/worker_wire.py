"""The worker's calls on the wire: the fence, claims, renewals and the acceptance points'
requests and responses. Pure and mechanical (see common_wire)."""

from __future__ import annotations

import math
from collections.abc import Sequence

from google.protobuf.timestamp_pb2 import Timestamp

from coordinator.domain import validation
from coordinator.domain.decisions import Fence, Verdict
from coordinator.domain.failures import FailureReport
from coordinator.errors import CoordinatorError, InvalidArgument
from coordinator.fence_wire import fence_to_proto
from coordinator.server.status import status_code_of
from coordinator.server.wire.common_wire import (
    parse_content_digest,
    parse_digest,
    parse_duration,
    parse_epoch,
    parse_error_code,
    parse_required_positive,
    parse_text,
    task_state_to_proto,
    timestamp_to_proto,
    verdict_fields,
)
from coordinator.store.attempts.renew_plans import Renewal, RenewAnswer
from coordinator.store.attempts.renewals import MAX_BATCH as MAX_RENEWALS
from coordinator.store.types import (
    ClaimResult,
    CommitResult,
    FailResult,
    RenewResult,
    StagingResult,
)
from coordinator.v1 import types_pb2, worker_pb2

MAX_ERROR_DETAILS = 16 * 1024
MAX_REQUEUE_DELAY = 86400.0

# --- proto -> domain -------------------------------------------------------------------------


def parse_fence(message: types_pb2.Fence, *, present: bool) -> Fence:
    """The domain Fence of a worker request; every part is required except cancel_generation."""
    if not present:
        raise InvalidArgument("fence is required: send back the fence the claim returned")
    return Fence(
        task_id=validation.task_id(message.task_id, "fence.task_id"),
        attempt_id=validation.attempt_id(message.attempt_id),
        claim_generation=parse_required_positive(
            "fence.claim_generation", message.claim_generation
        ),
        scheduler_epoch=parse_epoch("fence.scheduler_epoch", message.scheduler_epoch),
        # 0 is a real value here: a task never cancelled has cancel_generation 0.
        cancel_generation=validation.non_negative(
            "fence.cancel_generation", message.cancel_generation
        ),
    )


def parse_ttl(field: str, value: int) -> int:
    """A requested lease TTL in seconds (> 0); the store clamps it to the server's bounds."""
    return validation.positive(field, value)


def parse_wait_seconds(value: float, limit: float) -> float:
    """A long poll's wait: 0 (none) to the server's ``limit``."""
    if not (math.isfinite(value) and 0 <= value <= limit):
        raise InvalidArgument(
            f"wait_seconds must be 0 to {limit:g} (max_claim_wait), got {value:g}"
        )
    return value


MAX_TASKS_PER_CLAIM = 64
"""Tasks one ClaimNext (or a commit's next) may claim."""


def parse_max_tasks(field: str, value: int) -> int:
    """How many tasks a ClaimNext claims at most: 0 (one) to MAX_TASKS_PER_CLAIM."""
    if not 0 <= value <= MAX_TASKS_PER_CLAIM:
        raise InvalidArgument(f"{field} must be 0 to {MAX_TASKS_PER_CLAIM}, got {value}")
    return max(value, 1)


def batch_to_proto(results: Sequence[ClaimResult]) -> worker_pb2.ClaimResponse:
    """ClaimResponse for a batch: the first claim's own fields, the others in more_claims."""
    response = claim_to_proto(results[0])
    response.more_claims.extend(claim_to_proto(result) for result in results[1:])
    return response


def parse_renewal(request: worker_pb2.RenewRequest) -> Renewal:
    """One renewal: the fence, the progress marker and a checkpoint (if set)."""
    return Renewal(
        fence=parse_fence(request.fence, present=request.HasField("fence")),
        progress=parse_text("progress", request.progress),
        checkpoint=parse_checkpoint(request),
    )


def parse_renewals(request: worker_pb2.RenewManyRequest) -> list[Renewal | InvalidArgument]:
    """Every item of a RenewMany, or the error naming what is wrong with it (a bad item is
    answered on its own; the others are renewed)."""
    if len(request.renewals) > MAX_RENEWALS:
        raise InvalidArgument(
            f"renewals: at most {MAX_RENEWALS} per call, got {len(request.renewals)}; "
            "split the batch"
        )
    items: list[Renewal | InvalidArgument] = []
    for i, renewal in enumerate(request.renewals):
        try:
            items.append(parse_renewal(renewal))
        except InvalidArgument as exc:
            items.append(InvalidArgument(f"renewals[{i}].{exc}"))
    return items


def parse_checkpoint(request: worker_pb2.RenewRequest) -> bytes | None:
    """A renewal's checkpoint (bounded); None when the request sets none."""
    if not request.HasField("checkpoint"):
        return None
    return validation.max_bytes("checkpoint", request.checkpoint, validation.MAX_CHECKPOINT_BYTES)


def parse_result_payload(result: bytes, result_digest: str, result_ref: str) -> str:
    """Check an inline result and/or a reference to one; returns the result digest.

    With only a reference the digest is required (the bytes are elsewhere and cannot be
    hashed here); with inline bytes it must be theirs.
    """
    validation.max_bytes("result", result, validation.MAX_RESULT_BYTES)
    validation.text("result_ref", result_ref, validation.MAX_REF_CHARS)
    if result_ref and not result:
        return parse_digest("result_digest", result_digest)
    return parse_content_digest("result_digest", result_digest, result)


def parse_failure_report(request: worker_pb2.FailRequest) -> FailureReport:
    """The checked report of a FailRequest (every field bounded)."""
    if request.shutdown and not request.retryable:
        raise InvalidArgument(
            "shutdown gives the task back for another attempt: it needs retryable true"
        )
    return FailureReport(
        retryable=request.retryable,
        code=parse_error_code("error_code", request.error_code),
        message=validation.text("error_message", request.error_message),
        details=validation.max_bytes("error_details", request.error_details, MAX_ERROR_DETAILS),
        delay=_parse_requeue_delay(request),
        shutdown=request.shutdown,
    )


def _parse_requeue_delay(request: worker_pb2.FailRequest) -> float:
    if not request.HasField("requeue_delay"):
        return 0.0
    return parse_duration("requeue_delay", request.requeue_delay, at_most=MAX_REQUEUE_DELAY)


# --- domain -> proto -------------------------------------------------------------------------


def claim_to_proto(result: ClaimResult) -> worker_pb2.ClaimResponse:
    """ClaimResponse: the fence and the input only for the winner, state_version for anyone."""
    response = worker_pb2.ClaimResponse(**verdict_fields(result.verdict))
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


def renew_to_proto(result: RenewResult) -> worker_pb2.RenewResponse:
    """RenewResponse; the times only when the lease was kept alive."""
    return worker_pb2.RenewResponse(
        **verdict_fields(result.verdict),
        ttl_seconds=result.ttl,
        lease_expires_at=timestamp_to_proto(result.lease_expires_at),
        claim_deadline=timestamp_to_proto(result.deadline),
        checkpoint_refused=result.checkpoint_refused,
    )


def renew_many_to_proto(answers: Sequence[RenewAnswer]) -> worker_pb2.RenewManyResponse:
    """RenewManyResponse: each item's RenewResponse, or the error a Renew would have raised."""
    results = []
    for answer in answers:
        if isinstance(answer, CoordinatorError):
            error = worker_pb2.ItemError(code=status_code_of(answer).name, message=str(answer))
            results.append(worker_pb2.RenewManyResult(error=error))
        else:
            results.append(worker_pb2.RenewManyResult(renewal=renew_to_proto(answer)))
    return worker_pb2.RenewManyResponse(results=results)


def authorize_to_proto(verdict: Verdict) -> worker_pb2.AuthorizeToolResponse:
    """AuthorizeToolResponse from the store's verdict."""
    return worker_pb2.AuthorizeToolResponse(**verdict_fields(verdict))


def stage_to_proto(staged: StagingResult) -> worker_pb2.StageResultResponse:
    """StageResultResponse: the outcome (with its reason), and whether the staged result is
    the current one."""
    return worker_pb2.StageResultResponse(**verdict_fields(staged.verdict), current=staged.current)


def release_to_proto(verdict: Verdict) -> worker_pb2.ReleaseResponse:
    """ReleaseResponse from the store's verdict."""
    return worker_pb2.ReleaseResponse(**verdict_fields(verdict))


def fail_to_proto(result: FailResult) -> worker_pb2.FailResponse:
    """FailResponse; where the task went and when it is eligible again, when accepted."""
    return worker_pb2.FailResponse(
        **verdict_fields(result.verdict),
        state=task_state_to_proto(result.state),
        next_eligible_at=timestamp_to_proto(result.next_eligible_at),
    )


def commit_to_proto(result: CommitResult) -> worker_pb2.CommitResponse:
    """CommitResponse; the commit id and the task state only when COMMITTED."""
    return worker_pb2.CommitResponse(
        **verdict_fields(result.verdict),
        result_commit_id=result.result_commit_id,
        state=task_state_to_proto(result.state),
    )


def _set_time(field: Timestamp, seconds: float) -> None:
    if seconds:
        field.FromNanoseconds(round(seconds * 1e9))
