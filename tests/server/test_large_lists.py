"""ListTasks on legal data (issue 25 item 4): with tasks holding the largest input the server
accepts, listing by queue and by state answered INTERNAL (one etcd read of the records passed
the 4 MiB message limit), even for a queue of tiny tasks. Pages now read keys first and records
in bounded reads, leave inputs out unless asked, and stop before a page passes its byte budget.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from coordinator.domain.validation import MAX_INPUT_BYTES
from coordinator.store import Store, task_list
from coordinator.store.task_list import MAX_RECORD_BYTES, PAGE_BYTES, READ_BYTES, VALUES_PER_READ
from coordinator.store.types import TaskSpec
from coordinator.v1 import tasks_pb2, tasks_pb2_grpc, types_pb2

PM = (("x-coordinator-principal", "pm-1"),)
LARGE = 100
MESSAGE_LIMIT = 4 * 1024 * 1024


@pytest.fixture
def large_queue(store: Store) -> list[str]:
    """LARGE tasks with the largest legal input in queue "big", and two tiny ones in "tiny"."""
    ids = [f"big-{n:03d}" for n in range(LARGE)]
    for n, task_id in enumerate(ids):
        data = bytes([n % 251]) * MAX_INPUT_BYTES
        store.tasks.create(TaskSpec(task_id=task_id, queue="big", input=data), by="pm-1")
    for task_id in ("tiny-1", "tiny-2"):
        store.tasks.create(TaskSpec(task_id=task_id, queue="tiny", input=b"x"), by="pm-1")
    return ids


def _pages(
    tasks: tasks_pb2_grpc.TaskServiceStub, request: tasks_pb2.ListTasksRequest
) -> Iterator[tasks_pb2.ListTasksResponse]:
    token = ""
    while True:
        request.page_token = token
        reply = tasks.ListTasks(request, metadata=PM)
        yield reply
        token = reply.next_page_token
        if not token:
            return


def test_summaries_list_a_queue_and_a_state_of_max_inputs_in_one_page(
    tasks: tasks_pb2_grpc.TaskServiceStub, large_queue: list[str]
) -> None:
    for request in (
        tasks_pb2.ListTasksRequest(queue="big", page_size=1000),
        tasks_pb2.ListTasksRequest(state=types_pb2.TASK_STATE_READY, page_size=1000),
    ):
        pages = list(_pages(tasks, request))
        assert len(pages) == 1
        listed = pages[0].tasks
        assert [t.task_id for t in listed if t.queue == "big"] == large_queue
        assert all(t.input == b"" and t.input_digest for t in listed)
        assert pages[0].ByteSize() < 100 * 1024


def test_a_queue_of_tiny_tasks_lists_beside_large_ones(
    tasks: tasks_pb2_grpc.TaskServiceStub, large_queue: list[str]
) -> None:
    request = tasks_pb2.ListTasksRequest(queue="tiny", include_input=True)
    pages = list(_pages(tasks, request))
    assert [(t.task_id, t.input) for p in pages for t in p.tasks] == [
        ("tiny-1", b"x"),
        ("tiny-2", b"x"),
    ]


def test_with_inputs_pages_stay_within_the_byte_budget_and_cover_every_task(
    tasks: tasks_pb2_grpc.TaskServiceStub, large_queue: list[str]
) -> None:
    request = tasks_pb2.ListTasksRequest(queue="big", page_size=1000, include_input=True)
    pages = list(_pages(tasks, request))
    for page in pages:
        assert page.ByteSize() <= PAGE_BYTES + 64 * 1024 < MESSAGE_LIMIT
    listed = [t for page in pages for t in page.tasks]
    assert [t.task_id for t in listed] == large_queue
    assert all(t.input == bytes([n % 251]) * MAX_INPUT_BYTES for n, t in enumerate(listed))
    # 3 MiB of 256 KiB inputs: 11 a page, so 100 tasks take 10 pages.
    assert len(pages) == -(-LARGE // (PAGE_BYTES // (MAX_INPUT_BYTES + 1024)))


def test_one_read_of_records_cannot_pass_the_message_limit() -> None:
    assert VALUES_PER_READ >= 1
    assert VALUES_PER_READ * MAX_RECORD_BYTES <= READ_BYTES < MESSAGE_LIMIT


def test_a_sparse_filter_answers_short_pages_that_resume(
    tasks: tasks_pb2_grpc.TaskServiceStub, large_queue: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # A call looks at SCAN_KEYS tasks at most: the two tiny tasks sort after the hundred big
    # ones, so the first pages come back empty with a token, and only the token ends the scan.
    monkeypatch.setattr(task_list, "SCAN_KEYS", 40)
    pages = list(_pages(tasks, tasks_pb2.ListTasksRequest(queue="tiny")))
    assert [[t.task_id for t in p.tasks] for p in pages] == [[], [], ["tiny-1", "tiny-2"]]
