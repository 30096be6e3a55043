"""The work-queue fields of a task on the wire: retry policy, not_before, schedule_to_close.

Pure and mechanical (see common_wire): ``parse_*`` raises InvalidArgument naming the field as
the .proto spells it, so bad input writes nothing.
"""

from __future__ import annotations

import math
from typing import Any

from google.protobuf.duration_pb2 import Duration
from google.protobuf.timestamp_pb2 import Timestamp

from coordinator.domain import validation
from coordinator.domain.bulk_retry import (
    DEFAULT_LIMIT,
    MAX_LIMIT,
    BulkRetryPage,
    DeadLetterFilter,
)
from coordinator.domain.records import TaskRecord
from coordinator.domain.retry import MAX_NON_RETRYABLE, policy_of
from coordinator.domain.states import TaskState
from coordinator.errors import InvalidArgument
from coordinator.server.wire import page_tokens
from coordinator.server.wire.common_wire import parse_duration, parse_error_code, parse_timestamp
from coordinator.v1 import tasks_pb2, types_pb2

MAX_NOT_BEFORE_AHEAD = 30 * 86400.0
"""How far ahead a task may be scheduled: a bound on how long the delayed index holds it."""


def parse_retry_overrides(
    message: types_pb2.RetryPolicy, *, present: bool
) -> tuple[tuple[str, Any], ...]:
    """The RetryPolicy fields a CreateTask sets, as (name, value) pairs; the store resolves
    the rest and checks the bounds of the whole (naming ``retry_policy.<field>``)."""
    if not present:
        return ()
    fields: list[tuple[str, Any]] = []
    if message.HasField("max_attempts"):
        fields.append(("max_attempts", message.max_attempts))
    for name in ("initial_backoff", "max_backoff"):
        if message.HasField(name):
            fields.append((name, parse_duration(f"retry_policy.{name}", getattr(message, name))))
    if message.HasField("backoff_multiplier"):
        fields.append(("backoff_multiplier", _finite("backoff_multiplier", message)))
    if message.HasField("backoff_jitter"):
        fields.append(("backoff_jitter", _finite("backoff_jitter", message)))
    codes = list(message.non_retryable_errors)
    if codes:
        fields.append(("non_retryable_errors", _parse_codes(codes)))
    return tuple(fields)


def _finite(name: str, message: types_pb2.RetryPolicy) -> float:
    """A float field of the policy; the store checks its bounds, NaN and infinity stop here."""
    value = float(getattr(message, name))
    if not math.isfinite(value):
        raise InvalidArgument(f"retry_policy.{name} must be finite, got {value}")
    return value


def _parse_codes(codes: list[str]) -> tuple[str, ...]:
    """retry_policy.non_retryable_errors: at most 32 valid codes, duplicates dropped."""
    if len(codes) > MAX_NON_RETRYABLE:
        raise InvalidArgument(
            f"retry_policy.non_retryable_errors has {len(codes)} codes, the limit is "
            f"{MAX_NON_RETRYABLE}"
        )
    for code in codes:
        parse_error_code("retry_policy.non_retryable_errors", code)
    return tuple(dict.fromkeys(codes))


def parse_not_before(value: Timestamp, *, present: bool, now: float) -> float:
    """When a new task may first be claimed (0: at once); at most 30 days ahead."""
    if not present:
        return 0.0
    at = parse_timestamp("not_before", value)
    if at < 0:
        raise InvalidArgument(f"not_before must be a time after 1970, got {value.ToJsonString()}")
    if at - now > MAX_NOT_BEFORE_AHEAD:
        raise InvalidArgument(
            f"not_before is {at - now:.0f} s ahead; the limit is {MAX_NOT_BEFORE_AHEAD:.0f} s "
            "(30 days)"
        )
    return at


MAX_SCHEDULE_TO_CLOSE = 365 * 86400.0


def parse_schedule_to_close(value: Duration, *, present: bool) -> float:
    """A task's deadline from its creation, 1 s to 365 days (0: none)."""
    if not present:
        return 0.0
    return parse_duration(
        "schedule_to_close", value, at_least=1.0, at_most=MAX_SCHEDULE_TO_CLOSE, note=" (365 days)"
    )


def check_runnable_window(not_before: float, schedule_to_close: float, *, now: float) -> None:
    """A new task's deadline (``schedule_to_close`` from now) must end after its ``not_before``:
    else it would be FAILED (TIMED_OUT) before any worker could claim it, a dead letter made by
    one mistyped flag."""
    if not_before and schedule_to_close and now + schedule_to_close <= not_before:
        ahead = not_before - now
        raise InvalidArgument(
            f"schedule_to_close ({schedule_to_close:.0f} s from creation) ends before not_before "
            f"({ahead:.0f} s from now): the task would fail TIMED_OUT without ever running; give "
            f"a schedule_to_close longer than {ahead:.0f} s, or an earlier not_before"
        )


def policy_to_proto(task: TaskRecord) -> types_pb2.RetryPolicy:
    """The task's resolved retry policy on the wire (every field set)."""
    policy = policy_of(task)
    message = types_pb2.RetryPolicy(
        max_attempts=policy.max_attempts,
        backoff_multiplier=policy.backoff_multiplier,
        backoff_jitter=policy.backoff_jitter,
        non_retryable_errors=list(policy.non_retryable_errors),
    )
    message.initial_backoff.FromNanoseconds(round(policy.initial_backoff * 1e9))
    message.max_backoff.FromNanoseconds(round(policy.max_backoff * 1e9))
    return message


def parse_dead_letter_filter(request: tasks_pb2.RetryTasksRequest) -> DeadLetterFilter:
    """The tasks a RetryTasks picks: a queue (required), FAILED only, an optional error code
    and an optional failed_since."""
    if not request.queue:
        raise InvalidArgument("queue is required: RetryTasks retries the dead letters of one queue")
    if request.state not in (0, int(TaskState.FAILED)):
        name = (
            types_pb2.TaskState.Name(request.state) if request.state in _STATES else request.state
        )
        raise InvalidArgument(
            f"state must be TASK_STATE_FAILED (or unset), got {name}: only a dead letter can be "
            "retried"
        )
    since = 0.0
    if request.HasField("failed_since"):
        since = parse_timestamp("failed_since", request.failed_since)
        if since < 0:
            raise InvalidArgument("failed_since must be a time after 1970")
    code = parse_error_code("error_code", request.error_code) if request.error_code else ""
    return DeadLetterFilter(validation.queue(request.queue), code, since)


_STATES = frozenset(types_pb2.TaskState.values())


def parse_bulk_limit(value: int) -> int:
    """Tasks one RetryTasks call retries: 1-1000, 0 meaning 100."""
    if value == 0:
        return DEFAULT_LIMIT
    if not 1 <= value <= MAX_LIMIT:
        raise InvalidArgument(
            f"limit must be between 1 and {MAX_LIMIT} (0 means {DEFAULT_LIMIT}), got {value}"
        )
    return value


def retry_tasks_filters(request: tasks_pb2.RetryTasksRequest) -> page_tokens.Filters:
    """The fields a RetryTasks page token is bound to: the queue its position walks. Not the
    code or time filters: a pass resumed with a narrower or later ``failed_since`` (the CLI's
    ``--since 1h`` is relative to each call) still walks the same ids."""
    return {"queue": request.queue}


def bulk_retry_to_proto(
    page: BulkRetryPage, filters: page_tokens.Filters
) -> tasks_pb2.RetryTasksResponse:
    """What one RetryTasks call did, on the wire (its page token bound to ``filters``)."""
    return tasks_pb2.RetryTasksResponse(
        retried=list(page.retried),
        skipped=[tasks_pb2.SkippedTask(task_id=s.task_id, reason=s.reason) for s in page.skipped],
        next_page_token=page_tokens.issue("RetryTasks", filters, page.next_page_token),
        scanned=page.scanned,
    )
