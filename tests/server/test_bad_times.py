"""Every Timestamp and Duration a request carries: protobuf's own rules first, then the field's
bounds, each refusal INVALID_ARGUMENT naming the field, and nothing written.

The values are the ones issue 24 found answering INTERNAL (a ValueError or OverflowError out of
protobuf's conversions) or accepted and written although no protobuf runtime would build them.
"""

from __future__ import annotations

from typing import Any

import grpc
import pytest
from google.protobuf.duration_pb2 import Duration
from google.protobuf.timestamp_pb2 import Timestamp

from coordinator.v1 import tasks_pb2, tasks_pb2_grpc, types_pb2, worker_pb2, worker_pb2_grpc
from tests import helpers
from tests.helpers import Probe

INVALID = grpc.StatusCode.INVALID_ARGUMENT
WORKER_A = (("x-coordinator-principal", "worker-a"),)
BIG = 2**62
SECONDS = "seconds must be -62135596800 to 253402300799 (0001-01-01 to 9999-12-31)"

# (id, the bad value, text the message must hold): shared by every Duration field.
_BAD_DURATIONS: list[tuple[str, Duration, str]] = [
    (
        "huge-negative",
        Duration(seconds=-BIG),
        f"seconds must be -315576000000 to 315576000000, got -{BIG}",
    ),
    (
        "huge-positive",
        Duration(seconds=BIG),
        f"seconds must be -315576000000 to 315576000000, got {BIG}",
    ),
    ("nanos-1e9", Duration(seconds=0, nanos=10**9), "nanos must be -999999999 to 999999999"),
    (
        "sign-mismatch",
        Duration(seconds=1, nanos=-5),
        "nanos (-5) must have the sign of seconds (1)",
    ),
    (
        "sign-mismatch-neg",
        Duration(seconds=-1, nanos=5),
        "nanos (5) must have the sign of seconds (-1)",
    ),
]


# Every Duration field of a request, as (field, the request for a bad value, the call).
def _create_backoff(name: str) -> Any:
    return lambda d: tasks_pb2.CreateTaskRequest(
        task_id="new", retry_policy=types_pb2.RetryPolicy(**{name: d})
    )


def _cases() -> list[Any]:
    fields: list[tuple[str, str, Any]] = [
        ("retry_policy.initial_backoff", "CreateTask", _create_backoff("initial_backoff")),
        ("retry_policy.max_backoff", "CreateTask", _create_backoff("max_backoff")),
        (
            "schedule_to_close",
            "CreateTask",
            lambda d: tasks_pb2.CreateTaskRequest(task_id="new", schedule_to_close=d),
        ),
        (
            "schedule_to_close",
            "RetryTask",
            lambda d: tasks_pb2.RetryTaskRequest(task_id="t-1", schedule_to_close=d),
        ),
        ("requeue_delay", "Fail", None),  # built from the live fence in the test
    ]
    return [
        pytest.param(field, method, build, value, text, id=f"{method}-{field}-{case}")
        for field, method, build in fields
        for case, value, text in _BAD_DURATIONS
    ]


@pytest.mark.parametrize(("field", "method", "build", "value", "text"), _cases())
def test_a_broken_duration_is_refused_naming_the_field(
    field: str,
    method: str,
    build: Any,
    value: Duration,
    text: str,
    claimed: worker_pb2.ClaimResponse,
    tasks: tasks_pb2_grpc.TaskServiceStub,
    worker: worker_pb2_grpc.WorkerServiceStub,
    keyspace: Probe,
) -> None:
    if build is None:
        request = worker_pb2.FailRequest(fence=claimed.fence, error_code="E", requeue_delay=value)
    else:
        request = build(value)
    call = getattr(worker if method == "Fail" else tasks, method)
    helpers.refused(
        call,
        request,
        INVALID,
        f"{field} is not a valid Duration: {text}",
        keyspace,
        metadata=WORKER_A,
    )


@pytest.mark.parametrize(
    ("value", "text"),
    [
        pytest.param(
            Timestamp(seconds=1, nanos=2 * 10**9),
            "nanos must be 0 to 999999999, got 2000000000",
            id="nanos-2e9",
        ),
        pytest.param(
            Timestamp(seconds=1, nanos=-1), "nanos must be 0 to 999999999, got -1", id="nanos-neg"
        ),
        pytest.param(Timestamp(seconds=BIG), f"{SECONDS}, got {BIG}", id="seconds-2^62"),
        pytest.param(Timestamp(seconds=-BIG), f"{SECONDS}, got -{BIG}", id="seconds--2^62"),
        pytest.param(
            Timestamp(seconds=253_402_300_800), f"{SECONDS}, got 253402300800", id="year-10000"
        ),
    ],
)
def test_a_broken_not_before_is_refused_naming_the_field(
    value: Timestamp, text: str, tasks: tasks_pb2_grpc.TaskServiceStub, keyspace: Probe
) -> None:
    request = tasks_pb2.CreateTaskRequest(task_id="new", not_before=value)
    helpers.refused(
        tasks.CreateTask, request, INVALID, f"not_before is not a valid Timestamp: {text}", keyspace
    )


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (Duration(seconds=-1, nanos=-5), "requeue_delay must be 0 s to 86400 s, got -1 s"),
        (Duration(seconds=86400, nanos=1), "requeue_delay must be 0 s to 86400 s, got 86400 s"),
    ],
    ids=["negative", "a-nanosecond-over"],
)
def test_a_well_formed_duration_out_of_the_fields_bounds_is_refused(
    value: Duration,
    text: str,
    claimed: worker_pb2.ClaimResponse,
    worker: worker_pb2_grpc.WorkerServiceStub,
    keyspace: Probe,
) -> None:
    request = worker_pb2.FailRequest(fence=claimed.fence, error_code="E", requeue_delay=value)
    helpers.refused(worker.Fail, request, INVALID, text, keyspace, metadata=WORKER_A)


def test_the_edges_of_the_bounds_are_accepted(
    claimed: worker_pb2.ClaimResponse,
    tasks: tasks_pb2_grpc.TaskServiceStub,
    worker: worker_pb2_grpc.WorkerServiceStub,
) -> None:
    created = tasks.CreateTask(
        tasks_pb2.CreateTaskRequest(
            task_id="edges",
            schedule_to_close=Duration(seconds=365 * 86400),
            retry_policy=types_pb2.RetryPolicy(initial_backoff=Duration(seconds=0, nanos=1)),
            not_before=Timestamp(seconds=0),
        )
    ).task
    assert (created.state, created.retry_policy.initial_backoff.nanos) == (
        types_pb2.TASK_STATE_READY,
        1,
    )
    failed = worker.Fail(
        worker_pb2.FailRequest(
            fence=claimed.fence,
            error_code="E",
            retryable=True,
            requeue_delay=Duration(seconds=86400),
        ),
        metadata=WORKER_A,
    )
    assert failed.outcome == types_pb2.OUTCOME_OK, failed.message
    assert failed.next_eligible_at.seconds - claimed.lease_expires_at.seconds > 86000


@pytest.mark.parametrize("deadline", [1, 3599], ids=["ends-long-before", "ends-as-it-opens"])
def test_a_deadline_that_ends_before_not_before_is_refused(
    deadline: int, tasks: tasks_pb2_grpc.TaskServiceStub, keyspace: Probe
) -> None:
    """Such a task was created and FAILED (TIMED_OUT) with 0 attempts: a dead letter made by
    one mistyped flag (``--not-before 1h --schedule-to-close 3``)."""
    start = Timestamp()
    start.GetCurrentTime()
    start.seconds += 3600
    request = tasks_pb2.CreateTaskRequest(
        task_id="doomed", not_before=start, schedule_to_close=Duration(seconds=deadline)
    )
    helpers.refused(
        tasks.CreateTask,
        request,
        INVALID,
        f"schedule_to_close ({deadline} s from creation) ends before not_before",
        keyspace,
    )
    request.schedule_to_close.seconds = 3700  # a window of about 100 s to run in: created
    assert tasks.CreateTask(request).task.state == types_pb2.TASK_STATE_DELAYED
