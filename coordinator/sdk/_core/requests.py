"""The requests a worker sends, and how the claim and create answers are read: pure.

The sync ``WorkerClient`` and ``Claim`` (sdk/client.py, sdk/claim.py) and the asyncio ones
(sdk/aio/) send these the same way, each on its own channel; a held claim reads the answers of
its acceptance points in sdk/_core/held.py.
"""

from __future__ import annotations

import math
import secrets
import traceback
from collections.abc import Sequence
from datetime import datetime, timedelta

from coordinator.domain import validation
from coordinator.domain.decisions import Fence
from coordinator.domain.digests import digest_of
from coordinator.domain.states import TaskState
from coordinator.errors import InvalidArgument
from coordinator.fence_wire import fence_to_proto
from coordinator.sdk._duration import Duration, as_timedelta
from coordinator.sdk.tasks import TaskInfo, TaskRetryPolicy
from coordinator.v1 import tasks_pb2, types_pb2, worker_pb2

CLAIM_HINT = "a claim that landed holds the task until its lease expires; claim it again after that"
"""What OutcomeUnknown tells the caller of a claim."""

CREATE_HINT = (
    "a task may have been created: look for it with list_tasks (a task id or an "
    "idempotency_key makes a create safe to repeat)"
)
"""What OutcomeUnknown tells the caller of a create that was not retried."""

AnyClaim = worker_pb2.ClaimRequest | worker_pb2.ClaimNextRequest
"""A claim of one task or of a queue's next one."""


def claim_key() -> str:
    """A new idempotency key for one logical call that claims (Claim, ClaimNext, Commit with
    ``next``): every transport retry of that call sends it, so a retry whose first try landed
    gets that try's answer, the same attempt, instead of starting another that burns a try
    of the task's retry budget. Never reused: a call sent again with a changed request (a new
    epoch) is another call. 16 characters (96 random bits), as the server keeps each key in
    etcd, per principal, for as long as the longest lease."""
    return secrets.token_urlsafe(12)


def ttl_seconds(ttl: Duration) -> int:
    """A lease TTL in whole seconds, rounded up (the wire carries integers)."""
    seconds = as_timedelta(ttl, "ttl").total_seconds()
    if seconds <= 0:
        raise InvalidArgument(f"ttl must be positive, got {ttl}")
    return math.ceil(seconds)


def claim_request(
    task_id: str, *, ttl: Duration, epoch: int, expected_state_version: int
) -> worker_pb2.ClaimRequest:
    """A claim of ``task_id`` under the scheduler ``epoch``."""
    return worker_pb2.ClaimRequest(
        task_id=task_id,
        expected_state_version=expected_state_version,
        scheduler_epoch=epoch,
        ttl_seconds=ttl_seconds(ttl),
    )


def claim_next_request(
    queue: str, *, ttl: Duration, epoch: int, wait: float = 0.0, max_tasks: int = 1
) -> worker_pb2.ClaimNextRequest:
    """A claim of ``queue``'s next ready task (up to ``max_tasks`` of them) under the scheduler
    ``epoch`` (a long poll of up to ``wait`` seconds when it is not 0)."""
    if not 1 <= max_tasks <= MAX_TASKS:
        raise InvalidArgument(f"max_tasks must be 1 to {MAX_TASKS}, got {max_tasks}")
    return worker_pb2.ClaimNextRequest(
        queue=queue,
        scheduler_epoch=epoch,
        ttl_seconds=ttl_seconds(ttl),
        wait_seconds=wait,
        max_tasks=max_tasks if max_tasks > 1 else 0,
    )


MAX_TASKS = 64
"""Tasks one call may claim (the server's bound)."""


def claims_won(response: worker_pb2.ClaimResponse) -> list[worker_pb2.ClaimResponse]:
    """The claims a ClaimNext answer (or a commit's next) won: its own, then more_claims; none
    when it was not CLAIMED."""
    if response.outcome != types_pb2.OUTCOME_CLAIMED:
        return []
    return [response, *(more for more in response.more_claims if more.outcome == response.outcome)]


def long_poll(wait: Duration | None, call_timeout: timedelta) -> tuple[float, float | None]:
    """A ClaimNext's ``wait_seconds`` and its deadline: a long poll's call may take its wait
    plus one try's ``call_timeout``; a plain one (None) keeps the policy's deadline."""
    waited = as_timedelta(wait, "wait").total_seconds() if wait is not None else 0.0
    return waited, call_timeout.total_seconds() + waited if waited else None


def lease_clock_start(
    sent_at: float, answered_at: float, timeout: float | None, *, tries: int = 1
) -> float:
    """When a claim's lease clock starts: at the send, so it can only run early; but a long
    poll (``timeout`` set) is granted its lease only when it wins, up to its wait later, so
    its clock starts at the answer's arrival (late by the answer's flight, which the claim's
    safety margin covers), or the whole wait would be taken off the lease. A long poll
    answered after more than one try may carry an earlier try's grant (a replay, made up to
    the whole wait before the answer): its clock starts at the first send, and the first
    renewal sets it right."""
    return answered_at if timeout is not None and tries == 1 else sent_at


def epoch_moved(response: worker_pb2.ClaimResponse) -> bool:
    """Whether a claim was refused only because the scheduler epoch moved on."""
    return (
        response.outcome == types_pb2.OUTCOME_FENCED
        and response.reason == types_pb2.FENCE_REASON_EPOCH_CHANGED
    )


def repinned(request: AnyClaim, current: int) -> bool:
    """Carry the ``current`` epoch in ``request``; whether it differs from the one sent (then
    the claim is worth sending once more). No held claim is touched: a Claim keeps its fence."""
    if current == request.scheduler_epoch:
        return False
    request.scheduler_epoch = current
    return True


def create_request(
    task_id: str,
    *,
    input: bytes,
    queue: str,
    priority: int,
    requires_review: bool,
    non_replayable: bool,
    retry_policy: TaskRetryPolicy | None = None,
    not_before: datetime | None = None,
    schedule_to_close: Duration | None = None,
    depends_on: Sequence[str] | None = (),
) -> tasks_pb2.CreateTaskRequest:
    """A create of a READY task (an empty ``task_id``: the server generates one), DELAYED
    until ``not_before`` if set, WAITING until its ``depends_on`` tasks are DONE, with its own
    ``retry_policy`` and ``schedule_to_close``."""
    request = tasks_pb2.CreateTaskRequest(
        task_id=task_id,
        queue=queue,
        priority=priority,
        # refused here as the server would (a message past gRPC's limit would be answered
        # RESOURCE_EXHAUSTED, which reads as a busy replica and is retried for the whole budget)
        input=validation.max_bytes("input", input, validation.MAX_INPUT_BYTES),
        input_digest=digest_of(input),
        requires_review=requires_review,
        non_replayable=non_replayable,
        depends_on=_task_ids("depends_on", depends_on),
    )
    if retry_policy is not None:
        request.retry_policy.CopyFrom(retry_policy.to_proto())
    if not_before is not None:
        request.not_before.FromDatetime(not_before)
    if schedule_to_close is not None:
        deadline = as_timedelta(schedule_to_close, "schedule_to_close")
        request.schedule_to_close.FromTimedelta(deadline)
    return request


def _task_ids(name: str, ids: Sequence[str] | None) -> list[str]:
    """A list of task ids (None: none); a lone string is refused, not split into letters."""
    if isinstance(ids, str | bytes):
        raise TypeError(f"{name} takes a list of task ids, got a {type(ids).__name__}: {ids!r}")
    return list(ids or ())


def create_is_retried(task_id: str, idempotency_key: str) -> bool:
    """Whether a create may be retried: only with an explicit id or an idempotency key (a
    retry with neither could create a second task)."""
    return bool(task_id or idempotency_key)


def is_this_create(existing: TaskInfo, request: tasks_pb2.CreateTaskRequest) -> bool:
    """Whether the task that made a create of an explicit id AlreadyExists is the one
    ``request`` would create (same queue and input digest): a retry whose first try landed."""
    return existing.input_digest == request.input_digest and existing.queue == request.queue


# --- a held claim's acceptance points: every request carries the claim's fence -----------------

# Bounds of what Fail carries (the server refuses more: INVALID_ARGUMENT).
_MAX_ERROR_MESSAGE = 1024
_MAX_ERROR_DETAILS = 16 * 1024


RESULT_TYPES = (bytes, bytearray, memoryview)
"""What a commit or a stage takes as a result (a handler's return value included)."""


def result_bytes(result: object) -> bytes:
    """``result`` as the bytes a commit or a stage sends; a TypeError saying what to do for
    anything else (a str's digest cannot be taken: its encoding is the caller's choice), and
    InvalidArgument for one past the server's limit, as the server would answer (without it a
    result past gRPC's message limit came back RESOURCE_EXHAUSTED and was retried as a busy
    replica for the whole retry budget)."""
    if isinstance(result, RESULT_TYPES):
        return validation.max_bytes("result", bytes(result), validation.MAX_RESULT_BYTES)
    hint = ": encode it first, e.g. text.encode()" if isinstance(result, str) else ""
    raise TypeError(f"a result is bytes, not {type(result).__name__}{hint}")


def commit_request(
    fence: Fence,
    input_digest: str,
    result: bytes,
    *,
    result_ref: str,
    result_digest: str | None,
    evidence: Sequence[str],
) -> worker_pb2.CommitRequest:
    """A commit of ``result`` (its digest computed unless given) for the input it was made of."""
    result = result_bytes(result)
    return worker_pb2.CommitRequest(
        fence=fence_to_proto(fence),
        input_digest=input_digest,
        result_digest=result_digest or digest_of(result),
        result=result,
        result_ref=result_ref,
        evidence=list(evidence),
    )


def stage_request(
    fence: Fence, result: bytes, *, result_ref: str, result_digest: str | None
) -> worker_pb2.StageResultRequest:
    """A stage of ``result`` in the attempt's own area."""
    result = result_bytes(result)
    return worker_pb2.StageResultRequest(
        fence=fence_to_proto(fence),
        result_digest=result_digest or digest_of(result),
        result=result,
        result_ref=result_ref,
    )


def authorize_request(fence: Fence, tool: str, action: str) -> worker_pb2.AuthorizeToolRequest:
    """An ask of the tool acceptance point before a side effect."""
    return worker_pb2.AuthorizeToolRequest(fence=fence_to_proto(fence), tool=tool, action=action)


def release_request(fence: Fence, reason: str) -> worker_pb2.ReleaseRequest:
    """A give-back of the task (READY again)."""
    return worker_pb2.ReleaseRequest(fence=fence_to_proto(fence), reason=reason)


def fail_request(
    fence: Fence,
    error: BaseException | str,
    *,
    retryable: bool,
    delay: Duration | None,
    message: str,
    details: bytes,
    shutdown: bool = False,
) -> worker_pb2.FailRequest:
    """A Fail of the attempt: ``error`` is an exception (its type name is the error code, its
    text the message, its traceback the details) or an error code; ``shutdown``: given back
    as the worker stops (FailRequest.shutdown)."""
    if isinstance(error, BaseException):
        code = type(error).__name__
        message = message or str(error)
        details = details or "".join(traceback.format_exception(error)).encode()
    else:
        code = validation.error_code(error, "error")  # refused here, before any call
    request = worker_pb2.FailRequest(
        fence=fence_to_proto(fence),
        retryable=retryable,
        error_code=code,
        error_message=message[:_MAX_ERROR_MESSAGE],
        # The end of a traceback is the part that names the failure.
        error_details=details[-_MAX_ERROR_DETAILS:],
        shutdown=shutdown,
    )
    if delay is not None:
        request.requeue_delay.FromTimedelta(as_timedelta(delay, "delay"))
    return request


def list_tasks_request(
    *, queue: str, state: TaskState | None, blocked: bool, overdue: bool, page_size: int, token: str
) -> tasks_pb2.ListTasksRequest:
    """One page of ``list_tasks`` / ``iter_tasks``."""
    return tasks_pb2.ListTasksRequest(
        queue=queue,
        state=types_pb2.TaskState.ValueType(state or 0),
        blocked=blocked,
        overdue=overdue,
        page_size=page_size,
        page_token=token,
    )


def update_input_request(
    task_id: str, input: bytes, expected_revision: int
) -> tasks_pb2.UpdateInputRequest:
    """``update_input``'s request (the input bounded here as the server would)."""
    return tasks_pb2.UpdateInputRequest(
        task_id=task_id,
        input=validation.max_bytes("input", input, validation.MAX_INPUT_BYTES),
        input_digest=digest_of(input),
        expected_revision=expected_revision,
    )


def retry_task_request(
    task_id: str, reason: str, schedule_to_close: Duration | None
) -> tasks_pb2.RetryTaskRequest:
    """``retry_task``'s request; ``schedule_to_close``: a new deadline, that long from now."""
    request = tasks_pb2.RetryTaskRequest(task_id=task_id, reason=reason)
    if schedule_to_close is not None:
        request.schedule_to_close.FromTimedelta(
            as_timedelta(schedule_to_close, "schedule_to_close")
        )
    return request
