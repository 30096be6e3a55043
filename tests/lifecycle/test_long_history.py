"""A task's history has no bound (every claim adds an attempt): GetTask answers within gRPC's
message limit whatever its length, and ListAttempts pages through every attempt."""

from __future__ import annotations

import grpc
import pytest

from coordinator.server.services.task_service import GET_TASK_ATTEMPTS
from coordinator.store import Store
from coordinator.v1 import tasks_pb2, tasks_pb2_grpc
from tests.lifecycle.support import create, who
from tests.store.support import past_attempts

READ = who("viewer")
HISTORY = 12_000


def test_get_task_answers_whatever_the_history_and_list_attempts_pages_through_all(
    store: Store, tasks: tasks_pb2_grpc.TaskServiceStub
) -> None:
    task = create(store, "long")
    past_attempts(store, task, HISTORY)  # 12,000 real cycles take minutes here
    # One more real cycle on top: the claim numbers its attempt after the recorded ones.
    claimed = store.claims.claim("long", principal="w", epoch=1, ttl=30)
    assert claimed.fence is not None
    store.acceptance.release(claimed.fence, principal="w", reason="done for now")

    got = tasks.GetTask(tasks_pb2.GetTaskRequest(task_id="long"), metadata=READ)
    assert got.attempt_count == HISTORY + 1
    assert [a.attempt for a in got.attempts] == list(
        range(HISTORY + 2 - GET_TASK_ATTEMPTS, HISTORY + 2)
    )
    assert got.attempts[-1].attempt_id == claimed.fence.attempt_id

    numbers: list[int] = []
    token, pages = "", 0
    while True:
        page = tasks.ListAttempts(
            tasks_pb2.ListAttemptsRequest(task_id="long", page_size=1000, page_token=token),
            metadata=READ,
        )
        numbers += [a.attempt for a in page.attempts]
        pages += 1
        token = page.next_page_token
        if not token:
            break
    assert numbers == list(range(1, HISTORY + 2))
    assert pages == 13


@pytest.mark.parametrize(
    ("request_", "code", "message"),
    [
        (tasks_pb2.ListAttemptsRequest(task_id="ghost"), grpc.StatusCode.NOT_FOUND, "ghost"),
        (
            tasks_pb2.ListAttemptsRequest(task_id="t", page_token="x1"),
            grpc.StatusCode.INVALID_ARGUMENT,
            "is not one ListAttempts returned",
        ),
        (
            tasks_pb2.ListAttemptsRequest(task_id="t", page_size=1001),
            grpc.StatusCode.INVALID_ARGUMENT,
            "page_size must be between 1 and 1000",
        ),
    ],
)
def test_bad_list_attempts_requests_are_refused(
    store: Store,
    tasks: tasks_pb2_grpc.TaskServiceStub,
    request_: tasks_pb2.ListAttemptsRequest,
    code: grpc.StatusCode,
    message: str,
) -> None:
    create(store, "t")
    with pytest.raises(grpc.RpcError) as raised:
        tasks.ListAttempts(request_, metadata=READ)
    assert raised.value.code() is code
    assert message in (raised.value.details() or "")
