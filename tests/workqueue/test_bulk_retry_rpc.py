"""TaskService.RetryTasks over gRPC against a real server: what a bulk recovery after a bad
deploy retries, reports and refuses."""

from __future__ import annotations

from collections.abc import Callable

import grpc
import pytest
from google.protobuf.timestamp_pb2 import Timestamp

from coordinator.server import PRINCIPAL_METADATA_KEY
from coordinator.v1 import tasks_pb2, tasks_pb2_grpc, types_pb2, worker_pb2, worker_pb2_grpc
from tests.helpers import resumes_at

A = ((PRINCIPAL_METADATA_KEY, "worker-a"),)
PM = ((PRINCIPAL_METADATA_KEY, "pm-1"),)
Probe = Callable[[], tuple[int, int]]
ONE_ATTEMPT = types_pb2.RetryPolicy(max_attempts=1)


def dead_letter(
    tasks: tasks_pb2_grpc.TaskServiceStub,
    worker: worker_pb2_grpc.WorkerServiceStub,
    task_id: str,
    code: str,
    queue: str = "orders",
) -> None:
    """A task of ``queue`` whose one attempt failed with ``code``: FAILED."""
    create = tasks_pb2.CreateTaskRequest(task_id=task_id, queue=queue, retry_policy=ONE_ATTEMPT)
    tasks.CreateTask(create, metadata=PM)
    claim = worker_pb2.ClaimRequest(task_id=task_id, scheduler_epoch=1, ttl_seconds=30)
    fence = worker.Claim(claim, metadata=A).fence
    fail = worker_pb2.FailRequest(fence=fence, retryable=True, error_code=code)
    assert worker.Fail(fail, metadata=A).state == types_pb2.TASK_STATE_FAILED


def test_retry_tasks_reports_pages_and_is_idempotent(
    tasks: tasks_pb2_grpc.TaskServiceStub, worker: worker_pb2_grpc.WorkerServiceStub
) -> None:
    for n in range(3):
        dead_letter(tasks, worker, f"o{n}", "KeyError")
    dead_letter(tasks, worker, "o9", "Timeout")
    got = tasks.GetTask(tasks_pb2.GetTaskRequest(task_id="o0")).task
    assert (got.last_error_code, got.last_error) == ("KeyError", "KeyError")

    request = tasks_pb2.RetryTasksRequest(queue="orders", error_code="KeyError", dry_run=True)
    preview = tasks.RetryTasks(request, metadata=PM)
    assert (list(preview.retried), preview.next_page_token) == (["o0", "o1", "o2"], "")
    assert preview.scanned == 4
    assert tasks.GetTask(tasks_pb2.GetTaskRequest(task_id="o0")).task.state == (
        types_pb2.TASK_STATE_FAILED
    )

    request = tasks_pb2.RetryTasksRequest(
        queue="orders", error_code="KeyError", limit=2, reason="fixed in 1.4.2"
    )
    first = tasks.RetryTasks(request, metadata=PM)
    assert (list(first.retried), resumes_at(first.next_page_token)) == (["o0", "o1"], "o1")
    request.page_token = first.next_page_token
    rest = tasks.RetryTasks(request, metadata=PM)
    assert (list(rest.retried), rest.next_page_token) == (["o2"], "")
    request.page_token = ""
    assert list(tasks.RetryTasks(request, metadata=PM).retried) == []  # nothing left to do
    states = {
        t: tasks.GetTask(tasks_pb2.GetTaskRequest(task_id=t)).task.state
        for t in ("o0", "o1", "o2", "o9")
    }
    assert states == {
        "o0": types_pb2.TASK_STATE_READY,
        "o1": types_pb2.TASK_STATE_READY,
        "o2": types_pb2.TASK_STATE_READY,
        "o9": types_pb2.TASK_STATE_FAILED,
    }


def _since(seconds: int) -> Timestamp:
    return Timestamp(seconds=seconds)


@pytest.mark.parametrize(
    ("request_", "code", "message"),
    [
        (tasks_pb2.RetryTasksRequest(), grpc.StatusCode.INVALID_ARGUMENT, "queue is required"),
        (
            tasks_pb2.RetryTasksRequest(queue="orders", state=types_pb2.TASK_STATE_READY),
            grpc.StatusCode.INVALID_ARGUMENT,
            "state must be TASK_STATE_FAILED (or unset), got TASK_STATE_READY",
        ),
        (
            tasks_pb2.RetryTasksRequest(queue="orders", limit=1001),
            grpc.StatusCode.INVALID_ARGUMENT,
            "limit must be between 1 and 1000 (0 means 100), got 1001",
        ),
        (
            tasks_pb2.RetryTasksRequest(queue="orders", error_code="no spaces"),
            grpc.StatusCode.INVALID_ARGUMENT,
            "error_code",
        ),
        (
            tasks_pb2.RetryTasksRequest(queue="orders", failed_since=_since(-5)),
            grpc.StatusCode.INVALID_ARGUMENT,
            "failed_since must be a time after 1970",
        ),
        (
            tasks_pb2.RetryTasksRequest(queue="orders", reason="r" * 1025),
            grpc.StatusCode.INVALID_ARGUMENT,
            "reason is 1025 characters",
        ),
    ],
)
def test_bad_retry_tasks_requests_write_nothing(
    tasks: tasks_pb2_grpc.TaskServiceStub,
    worker: worker_pb2_grpc.WorkerServiceStub,
    keyspace: Probe,
    request_: tasks_pb2.RetryTasksRequest,
    code: grpc.StatusCode,
    message: str,
) -> None:
    dead_letter(tasks, worker, "o0", "KeyError")
    before = keyspace()
    with pytest.raises(grpc.RpcError) as refused:
        tasks.RetryTasks(request_, metadata=PM)
    assert refused.value.code() is code
    assert message in (refused.value.details() or "")
    assert keyspace() == before
