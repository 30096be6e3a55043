"""The work-queue fields over gRPC: CreateTask's retry_policy and not_before, what GetTask and
ListTasks show, RetryTask, the dead-letter events and the bad input every new field refuses."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import grpc
import pytest
from google.protobuf.duration_pb2 import Duration
from google.protobuf.timestamp_pb2 import Timestamp

from coordinator.server import PRINCIPAL_METADATA_KEY
from coordinator.v1 import tasks_pb2, tasks_pb2_grpc, types_pb2, worker_pb2, worker_pb2_grpc

A = ((PRINCIPAL_METADATA_KEY, "worker-a"),)
PM = ((PRINCIPAL_METADATA_KEY, "pm-1"),)
Probe = Callable[[], tuple[int, int]]


def _at(seconds_from_now: float) -> Timestamp:
    ts = Timestamp()
    ts.FromNanoseconds(round((time.time() + seconds_from_now) * 1e9))
    return ts


def _claim(worker: worker_pb2_grpc.WorkerServiceStub, task_id: str) -> types_pb2.Fence:
    response = worker.Claim(
        worker_pb2.ClaimRequest(task_id=task_id, scheduler_epoch=1, ttl_seconds=30), metadata=A
    )
    assert response.outcome == types_pb2.OUTCOME_CLAIMED, response.message
    return response.fence


def test_a_dead_letter_is_visible_listed_and_retried_with_a_fresh_budget(
    tasks: tasks_pb2_grpc.TaskServiceStub, worker: worker_pb2_grpc.WorkerServiceStub
) -> None:
    policy = types_pb2.RetryPolicy(max_attempts=1, non_retryable_errors=["BadInput"])
    tasks.CreateTask(tasks_pb2.CreateTaskRequest(task_id="t", retry_policy=policy), metadata=PM)
    tasks.CreateTask(tasks_pb2.CreateTaskRequest(task_id="ok"), metadata=PM)
    fail = worker_pb2.FailRequest(
        fence=_claim(worker, "t"), retryable=True, error_code="Flaky", error_message="oops"
    )
    assert worker.Fail(fail, metadata=A).state == types_pb2.TASK_STATE_FAILED

    got = tasks.GetTask(tasks_pb2.GetTaskRequest(task_id="t")).task
    assert (got.state, got.dead_letter_reason, got.last_error, got.attempts_counted) == (
        types_pb2.TASK_STATE_FAILED,
        types_pb2.DEAD_LETTER_REASON_EXHAUSTED,
        "Flaky: oops",
        1,
    )
    resolved = got.retry_policy  # the task's own fields, the rest the server's defaults
    assert (resolved.max_attempts, list(resolved.non_retryable_errors)) == (1, ["BadInput"])
    assert (resolved.backoff_multiplier, resolved.max_backoff.seconds) == (2.0, 300)
    failed = tasks.ListTasks(tasks_pb2.ListTasksRequest(state=types_pb2.TASK_STATE_FAILED))
    assert [t.task_id for t in failed.tasks] == ["t"]

    retried = tasks.RetryTask(tasks_pb2.RetryTaskRequest(task_id="t", reason="fixed"), metadata=PM)
    assert (retried.task.state, retried.task.attempts_counted, retried.task.attempt) == (
        types_pb2.TASK_STATE_READY,
        0,
        1,
    )
    again = tasks.RetryTask(tasks_pb2.RetryTaskRequest(task_id="t"), metadata=PM)
    assert again.task.state_version == retried.task.state_version  # a repeat writes nothing
    events = list(tasks.WatchEvents(tasks_pb2.WatchEventsRequest(task_id="t")))
    assert [e.op for e in events] == ["create", "claim", "dead_letter", "retry"]
    assert (events[-1].by, events[-1].detail) == ("pm-1", "fixed")
    assert events[2].detail == "all 1 attempts used; last error: Flaky: oops"

    _claim(worker, "t")  # claimable again; a claimed task with a counted attempt is no repeat
    with pytest.raises(grpc.RpcError) as refused:
        tasks.RetryTask(tasks_pb2.RetryTaskRequest(task_id="t"), metadata=PM)
    assert refused.value.code() is grpc.StatusCode.FAILED_PRECONDITION
    assert "only a FAILED task can be retried" in (refused.value.details() or "")


def test_not_before_keeps_a_new_task_delayed_until_then(
    tasks: tasks_pb2_grpc.TaskServiceStub, worker: worker_pb2_grpc.WorkerServiceStub
) -> None:
    created = tasks.CreateTask(
        tasks_pb2.CreateTaskRequest(task_id="later", not_before=_at(3600)), metadata=PM
    ).task
    assert created.state == types_pb2.TASK_STATE_DELAYED
    assert abs(created.next_eligible_at.seconds - (time.time() + 3600)) < 5
    refused = worker.Claim(
        worker_pb2.ClaimRequest(task_id="later", scheduler_epoch=1, ttl_seconds=30), metadata=A
    )
    assert refused.outcome == types_pb2.OUTCOME_NOT_CLAIMABLE
    past = tasks.CreateTask(
        tasks_pb2.CreateTaskRequest(task_id="past", not_before=_at(-10)), metadata=PM
    ).task
    assert past.state == types_pb2.TASK_STATE_READY


BAD_CREATES: list[tuple[dict[str, Any], str]] = [
    ({"retry_policy": types_pb2.RetryPolicy(max_attempts=-1)}, "retry_policy.max_attempts"),
    ({"retry_policy": types_pb2.RetryPolicy(max_attempts=10_001)}, "retry_policy.max_attempts"),
    (
        {"retry_policy": types_pb2.RetryPolicy(initial_backoff=Duration(seconds=-1))},
        "retry_policy.initial_backoff must be >= 0",
    ),
    (
        {"retry_policy": types_pb2.RetryPolicy(initial_backoff=Duration(seconds=301))},
        "retry_policy.initial_backoff (301 s) must not exceed retry_policy.max_backoff",
    ),
    (
        {"retry_policy": types_pb2.RetryPolicy(max_backoff=Duration(seconds=700_000))},
        "retry_policy.max_backoff must be 0 to",
    ),
    (
        {"retry_policy": types_pb2.RetryPolicy(backoff_multiplier=0.5)},
        "retry_policy.backoff_multiplier must be 1 to",
    ),
    (
        {"retry_policy": types_pb2.RetryPolicy(backoff_multiplier=float("nan"))},
        "retry_policy.backoff_multiplier must be finite",
    ),
    (
        {"retry_policy": types_pb2.RetryPolicy(non_retryable_errors=["bad code"])},
        "retry_policy.non_retryable_errors must be 1-128 characters",
    ),
    (
        {"retry_policy": types_pb2.RetryPolicy(non_retryable_errors=[f"E{n}" for n in range(33)])},
        "retry_policy.non_retryable_errors has 33 codes",
    ),
    ({"not_before": Timestamp(seconds=int(time.time()) + 31 * 86400)}, "not_before is"),
    ({"not_before": Timestamp(seconds=-5)}, "not_before must be a time after 1970"),
    ({"not_before": Timestamp(seconds=int(time.time()) + 60), "depends_on": ["up"]}, "not_before"),
]


@pytest.mark.parametrize(("fields", "message"), BAD_CREATES)
def test_bad_work_queue_fields_are_refused_naming_the_field(
    tasks: tasks_pb2_grpc.TaskServiceStub, keyspace: Probe, fields: dict[str, Any], message: str
) -> None:
    tasks.CreateTask(tasks_pb2.CreateTaskRequest(task_id="up"), metadata=PM)
    before = keyspace()
    with pytest.raises(grpc.RpcError) as refused:
        tasks.CreateTask(tasks_pb2.CreateTaskRequest(task_id="t", **fields), metadata=PM)
    assert refused.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert message in (refused.value.details() or "")
    assert keyspace() == before


@pytest.mark.parametrize(
    ("request_", "code", "message"),
    [
        (tasks_pb2.RetryTaskRequest(), grpc.StatusCode.INVALID_ARGUMENT, "task_id is required"),
        (
            tasks_pb2.RetryTaskRequest(task_id="up", reason="r" * 1025),
            grpc.StatusCode.INVALID_ARGUMENT,
            "reason is 1025 characters",
        ),
        (tasks_pb2.RetryTaskRequest(task_id="ghost"), grpc.StatusCode.NOT_FOUND, "ghost"),
        (
            tasks_pb2.RetryTaskRequest(task_id="up"),
            grpc.StatusCode.FAILED_PRECONDITION,
            "task 'up' is CANCELLED; only a FAILED task can be retried",
        ),
        (
            # Never dead-lettered: READY with no attempt counted, yet no retry to repeat.
            tasks_pb2.RetryTaskRequest(task_id="fresh"),
            grpc.StatusCode.FAILED_PRECONDITION,
            "task 'fresh' is READY; only a FAILED task can be retried",
        ),
        (
            tasks_pb2.RetryTaskRequest(task_id="up", schedule_to_close=Duration(seconds=0)),
            grpc.StatusCode.INVALID_ARGUMENT,
            "schedule_to_close must be 1 s to 31536000 s (365 days), got 0 s",
        ),
    ],
)
def test_bad_retry_task_requests_write_nothing(
    tasks: tasks_pb2_grpc.TaskServiceStub,
    keyspace: Probe,
    request_: tasks_pb2.RetryTaskRequest,
    code: grpc.StatusCode,
    message: str,
) -> None:
    tasks.CreateTask(tasks_pb2.CreateTaskRequest(task_id="up"), metadata=PM)
    tasks.CancelTask(tasks_pb2.CancelTaskRequest(task_id="up"), metadata=PM)
    tasks.CreateTask(tasks_pb2.CreateTaskRequest(task_id="fresh"), metadata=PM)
    before = keyspace()
    with pytest.raises(grpc.RpcError) as refused:
        tasks.RetryTask(request_, metadata=PM)
    assert refused.value.code() is code
    assert message in (refused.value.details() or "")
    assert keyspace() == before
