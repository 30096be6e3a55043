"""TaskService.ListEvents: the event log newest first, a bounded page at a time, paged back
with ``before`` (what the console's events page reads)."""

from __future__ import annotations

from collections.abc import Callable

import grpc
import pytest

from coordinator.store import Store
from coordinator.v1 import tasks_pb2, tasks_pb2_grpc
from tests.lifecycle.support import create, who

READ = who("viewer")
Probe = Callable[[], tuple[int, int]]


def _page(
    tasks: tasks_pb2_grpc.TaskServiceStub, **fields: object
) -> tuple[list[tuple[str, str]], tasks_pb2.ListEventsResponse]:
    reply = tasks.ListEvents(tasks_pb2.ListEventsRequest(**fields), metadata=READ)  # type: ignore[arg-type]
    return [(e.task_id, e.op) for e in reply.events], reply


def test_events_come_newest_first_and_page_back_to_the_start(
    store: Store, tasks: tasks_pb2_grpc.TaskServiceStub
) -> None:
    for task_id in ("a", "b", "c", "d", "e"):
        create(store, task_id)
    store.tasks.cancel("b", by="pm", reason="not needed")
    shown, reply = _page(tasks, page_size=4)
    assert shown == [("b", "cancel"), ("e", "create"), ("d", "create"), ("c", "create")]
    older, reply = _page(tasks, page_size=4, before=reply.next_before)
    assert older == [("b", "create"), ("a", "create")]
    assert not reply.HasField("next_before")  # the start of the log

    one_task, reply = _page(tasks, task_id="b")
    assert one_task == [("b", "cancel"), ("b", "create")]
    full, reply = _page(tasks, page_size=6)
    assert len(full) == 6 and reply.HasField("next_before")
    nothing, reply = _page(tasks, before=reply.next_before)
    assert (nothing, reply.HasField("next_before")) == ([], False)


@pytest.mark.parametrize(
    ("request_", "message"),
    [
        (tasks_pb2.ListEventsRequest(page_size=1001), "page_size must be between 1 and 1000"),
        (
            tasks_pb2.ListEventsRequest(before=tasks_pb2.EventPosition(revision=0)),
            "before.revision must be >= 1, got 0",
        ),
        (
            tasks_pb2.ListEventsRequest(
                before=tasks_pb2.EventPosition(revision=5, task_id="bad id!")
            ),
            "before.task_id",
        ),
    ],
)
def test_a_bad_list_events_request_is_refused_with_the_field(
    tasks: tasks_pb2_grpc.TaskServiceStub, request_: tasks_pb2.ListEventsRequest, message: str
) -> None:
    with pytest.raises(grpc.RpcError) as refused:
        tasks.ListEvents(request_, metadata=READ)
    assert refused.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert message in (refused.value.details() or "")
