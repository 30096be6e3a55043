"""The work-queue fields of a task on the wire: retry policy, not_before, schedule_to_close.

Pure and mechanical (see common_wire): ``parse_*`` raises InvalidArgument naming the field as
the .proto spells it, so bad input writes nothing.
"""

from __future__ import annotations

import math
from typing import Any

from google.protobuf.duration_pb2 import Duration
from google.protobuf.timestamp_pb2 import Timestamp

from coordinator.domain.records import TaskRecord
from coordinator.domain.retry import MAX_NON_RETRYABLE, policy_of
from coordinator.errors import InvalidArgument
from coordinator.server.common_wire import parse_duration, parse_error_code, parse_timestamp
from coordinator.v1 import types_pb2

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
        multiplier = message.backoff_multiplier
        if not math.isfinite(multiplier):
            raise InvalidArgument(
                f"retry_policy.backoff_multiplier must be finite, got {multiplier}"
            )
        fields.append(("backoff_multiplier", multiplier))
    codes = list(message.non_retryable_errors)
    if codes:
        if len(codes) > MAX_NON_RETRYABLE:
            raise InvalidArgument(
                f"retry_policy.non_retryable_errors has {len(codes)} codes, the limit is "
                f"{MAX_NON_RETRYABLE}"
            )
        for code in codes:
            parse_error_code("retry_policy.non_retryable_errors", code)
        fields.append(("non_retryable_errors", tuple(dict.fromkeys(codes))))
    return tuple(fields)


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


def policy_to_proto(task: TaskRecord) -> types_pb2.RetryPolicy:
    """The task's resolved retry policy on the wire (every field set)."""
    policy = policy_of(task)
    message = types_pb2.RetryPolicy(
        max_attempts=policy.max_attempts,
        backoff_multiplier=policy.backoff_multiplier,
        non_retryable_errors=list(policy.non_retryable_errors),
    )
    message.initial_backoff.FromNanoseconds(round(policy.initial_backoff * 1e9))
    message.max_backoff.FromNanoseconds(round(policy.max_backoff * 1e9))
    return message
