"""ListTasks on legal data (issue 25 item 4): with tasks holding the largest input the server
accepts, listing by queue and by state answered INTERNAL (one etcd read of the records passed
the 4 MiB message limit), even for a queue of tiny tasks. Pages now read keys first and records
in bounded reads, leave inputs out unless asked, and stop before a page passes its byte budget.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace

import pytest

from coordinator.domain.records import AttemptRecord, encode
from coordinator.domain.validation import MAX_CHECKPOINT_BYTES, MAX_INPUT_BYTES
from coordinator.server.wire.worker_wire import MAX_ERROR_DETAILS
from coordinator.store import Store
from coordinator.store.etcd.ops import put
from coordinator.store.lifecycle import task_list
from coordinator.store.lifecycle.task_list import (
    MAX_RECORD_BYTES,
    PAGE_BYTES,
    READ_BYTES,
    VALUES_PER_READ,
)
from coordinator.store.lifecycle.tasks import MAX_ATTEMPT_RECORD_BYTES
from coordinator.store.types import TaskSpec
from coordinator.v1 import tasks_pb2, tasks_pb2_grpc, types_pb2
from tests.store.support import claim

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


def _first_attempt(store: Store) -> AttemptRecord:
    """Claim t-1: its first attempt's record (the others are copies of it, written as is)."""
    claim(store, "t-1")
    (running,) = store.tasks.attempts("t-1")  # the task record holds it (schema 3)
    return running


def test_attempts_with_maximal_checkpoints_and_details_list_in_bounded_pages(
    store: Store, tasks: tasks_pb2_grpc.TaskServiceStub
) -> None:
    # 60 attempts of the largest legal record (a 64 KiB checkpoint, 16 KiB of error details):
    # one read of 100 attempt numbers was ~11 MiB and ListAttempts answered INTERNAL.
    store.tasks.create(TaskSpec(task_id="t-1", input=b"x"), by="pm-1")
    record = _first_attempt(store)
    for n in range(2, 61):
        big = replace(
            record,
            attempt_id=f"a{n}-x",
            attempt=n,
            checkpoint=b"c" * MAX_CHECKPOINT_BYTES,
            error_details=b"d" * MAX_ERROR_DETAILS,
            error_message="m" * 1024,
        )
        store.ctx.kv.txn((), [put(store.ctx.keys.attempt("t-1", big.attempt_id), encode(big))])
    assert len(encode(big)) + 8 * 1024 <= MAX_ATTEMPT_RECORD_BYTES
    listed: list[int] = []
    token = ""
    pages = 0
    while True:
        request = tasks_pb2.ListAttemptsRequest(task_id="t-1", page_size=1000, page_token=token)
        reply = tasks.ListAttempts(request, metadata=PM)
        assert reply.ByteSize() <= PAGE_BYTES + 64 * 1024
        listed += [a.attempt for a in reply.attempts]
        pages += 1
        token = reply.next_page_token
        if not token:
            break
    assert listed == list(range(1, 61))
    assert pages == 1  # 60 x 17 KiB of details: one page within the budget
    assert len(store.tasks.attempts("t-1", count=100)) == 60  # GetTask's read holds too


def test_a_page_of_attempts_stops_at_its_byte_budget(store: Store) -> None:
    store.tasks.create(TaskSpec(task_id="t-1", input=b"x"), by="pm-1")
    record = _first_attempt(store)
    for n in range(2, 6):
        big = replace(record, attempt_id=f"a{n}-x", attempt=n, error_details=b"d" * 1000)
        store.ctx.kv.txn((), [put(store.ctx.keys.attempt("t-1", big.attempt_id), encode(big))])
    page, following = store.tasks.attempts_page("t-1", first=1, count=100, max_bytes=2600)
    assert ([a.attempt for a in page], following) == ([1, 2], 3)
    page, following = store.tasks.attempts_page("t-1", first=3, count=100, max_bytes=10**6)
    assert ([a.attempt for a in page], following) == ([3, 4, 5], 103)


def test_claims_and_dependencies_of_tasks_with_max_inputs_list(
    store: Store, tasks: tasks_pb2_grpc.TaskServiceStub
) -> None:
    # Both read the task records (inputs and all) in batches of 50 and 100: past 4 MiB.
    data = b"i" * MAX_INPUT_BYTES
    ids = [f"up-{n:02d}" for n in range(30)]
    for task_id in ids:
        store.tasks.create(TaskSpec(task_id=task_id, queue="big", input=data), by="pm-1")
    store.tasks.create(TaskSpec(task_id="down", input=data, depends_on=tuple(ids)), by="pm-1")
    for task_id in ids[:20]:
        claim(store, task_id)
    claims = tasks.ListClaims(tasks_pb2.ListClaimsRequest(queue="big"), metadata=PM)
    assert sorted(c.task_id for c in claims.claims) == ids[:20]
    request = tasks_pb2.ListDependenciesRequest(task_id="down", page_size=1000)
    graph = tasks.ListDependencies(request, metadata=PM)
    assert sorted(n.task_id for n in graph.upstreams) == ids
    dependents = tasks_pb2.ListDependenciesRequest(task_id="up-00")
    assert [n.task_id for n in tasks.ListDependencies(dependents, metadata=PM).dependents] == [
        "down"
    ]
