"""What a call writes to etcd is never more than its caller's write budget is charged for it
(coordinator/server/interceptors/write_budgets.py). A create with no input was charged
nothing, so one producer token wrote 52 KB and 57 keys a create (long ids, fifty upstreams)
until etcd was full; a failure's 16 KiB of details and an effect slot were charged nothing at
all. Each case below is the largest the request's bounds allow, or the smallest call."""

from __future__ import annotations

from typing import Any

import pytest
from google.protobuf.timestamp_pb2 import Timestamp

from coordinator.domain.digests import digest_of
from coordinator.domain.effects import MAX_ETAG_CHARS, MAX_REF_CHARS
from coordinator.domain.retry import MAX_NON_RETRYABLE
from coordinator.server.interceptors.write_budgets import charged_bytes
from coordinator.store import Store
from coordinator.v1 import tasks_pb2, tasks_pb2_grpc, types_pb2, worker_pb2, worker_pb2_grpc
from tests.helpers import Probe
from tests.store.support import writes_between

LONG = 128  # the longest id a request may carry
UPSTREAMS = 50


def _written(store: Store, keyspace: Probe, call: Any) -> int:
    """The key and value bytes under the prefix that ``call()`` wrote."""
    before = keyspace()[1]
    call()
    after = keyspace()[1]
    return sum(len(e.key) + len(e.value) for e in writes_between(store, before + 1, after))


def _id(n: int, c: str = "t") -> str:
    return f"{c}{n:03d}".ljust(LONG, c)


def _create(task_id: str, **fields: Any) -> tasks_pb2.CreateTaskRequest:
    return tasks_pb2.CreateTaskRequest(task_id=task_id, **fields)


def _claim(worker: worker_pb2_grpc.WorkerServiceStub, queue: str) -> types_pb2.Fence:
    won = worker.ClaimNext(
        worker_pb2.ClaimNextRequest(queue=queue, scheduler_epoch=1, ttl_seconds=30)
    )
    assert won.outcome == types_pb2.OUTCOME_CLAIMED
    return won.fence


def _charged(method: str, request: Any) -> int:
    return charged_bytes(f"/coordinator.v1.{method}", request)


@pytest.mark.parametrize("upstreams", [0, UPSTREAMS])
def test_a_create_writes_no_more_than_it_is_charged(
    tasks: tasks_pb2_grpc.TaskServiceStub, store: Store, keyspace: Probe, upstreams: int
) -> None:
    for n in range(upstreams):
        tasks.CreateTask(_create(_id(n, "u"), not_before=_far()))
    smallest = _create("s")
    assert _written(store, keyspace, lambda: tasks.CreateTask(smallest)) <= _charged(
        "TaskService/CreateTask", smallest
    )
    largest = _create(
        _id(0),
        queue="q" * 64,
        thread_key="k" * LONG,
        root_task_id="s",
        parent_task_id="s",
        depends_on=[_id(n, "u") for n in range(upstreams)],
        retry_policy=types_pb2.RetryPolicy(
            non_retryable_errors=[f"E{n:02d}".ljust(LONG, "e") for n in range(MAX_NON_RETRYABLE)]
        ),
    )
    written = _written(store, keyspace, lambda: tasks.CreateTask(largest))
    assert written > 20_000 if upstreams else written > 5_000  # the case is the large one
    assert written <= _charged("TaskService/CreateTask", largest)


def test_new_dependencies_write_no_more_than_they_are_charged(
    tasks: tasks_pb2_grpc.TaskServiceStub, store: Store, keyspace: Probe
) -> None:
    for n in range(2 * UPSTREAMS):
        tasks.CreateTask(_create(_id(n, "u"), not_before=_far()))
    tasks.CreateTask(_create(_id(0), depends_on=[_id(n, "u") for n in range(UPSTREAMS)]))
    swap = tasks_pb2.SetDependenciesRequest(
        task_id=_id(0), depends_on=[_id(n, "u") for n in range(UPSTREAMS, 2 * UPSTREAMS)]
    )
    written = _written(store, keyspace, lambda: tasks.SetDependencies(swap))
    assert written > 20_000  # the case is the large one
    assert written <= _charged("TaskService/SetDependencies", swap)


def test_an_input_change_writes_no_more_than_it_is_charged(
    tasks: tasks_pb2_grpc.TaskServiceStub, store: Store, keyspace: Probe
) -> None:
    tasks.CreateTask(_create(_id(0), input=b"a", input_digest=digest_of(b"a")))
    change = tasks_pb2.UpdateInputRequest(task_id=_id(0), input=b"b", input_digest=digest_of(b"b"))
    written = _written(store, keyspace, lambda: tasks.UpdateInput(change))
    assert 0 < written <= _charged("TaskService/UpdateInput", change)


def test_a_failure_writes_no_more_than_it_is_charged(
    tasks: tasks_pb2_grpc.TaskServiceStub,
    worker: worker_pb2_grpc.WorkerServiceStub,
    store: Store,
    keyspace: Probe,
) -> None:
    tasks.CreateTask(_create(_id(0), queue="q" * 64))
    fence = _claim(worker, "q" * 64)
    fail = worker_pb2.FailRequest(
        fence=fence,
        retryable=True,
        error_code="E" * LONG,
        error_message="m" * 1024,
        error_details=b"d" * 16384,
    )
    written = _written(store, keyspace, lambda: worker.Fail(fail))
    assert written > 16384
    assert written <= _charged("WorkerService/Fail", fail)


def test_a_stage_and_a_commit_write_no_more_than_they_are_charged_beyond_the_cycle(
    tasks: tasks_pb2_grpc.TaskServiceStub,
    worker: worker_pb2_grpc.WorkerServiceStub,
    store: Store,
    keyspace: Probe,
) -> None:
    """A result is stored base64 (a third more than its bytes), a commit's evidence as JSON
    text. A commit was charged nothing: one token committing 512 KiB results filled etcd to
    NOSPACE in seconds. What a commit with no result writes (the cycle's own keys, the cost of
    draining) stays free; everything past it is charged."""
    result = bytes(range(256)) * 2048  # 512 KiB
    for n in range(3):
        tasks.CreateTask(_create(_id(n), queue="q" * 64))
    empty = digest_of(b"")
    plain = worker_pb2.CommitRequest(
        fence=_claim(worker, "q" * 64), input_digest=empty, result_digest=empty
    )
    baseline, _ = _within_charge(store, keyspace, "Commit", worker.Commit, plain, free=5_000)
    stage = worker_pb2.StageResultRequest(
        fence=_claim(worker, "q" * 64), result_digest=digest_of(result), result=result
    )
    written, _ = _within_charge(store, keyspace, "StageResult", worker.StageResult, stage)
    assert written > len(result) * 4 // 3
    full = worker_pb2.CommitRequest(
        fence=_claim(worker, "q" * 64),
        input_digest=empty,
        result_digest=digest_of(result),
        result=result,
        evidence=[f"\x01{n:02d}".ljust(MAX_REF_CHARS, "\x01") for n in range(64)],
    )
    written, answer = _within_charge(store, keyspace, "Commit", worker.Commit, full, free=baseline)
    assert answer.outcome == types_pb2.OUTCOME_COMMITTED
    assert written - baseline > len(result) * 4 // 3 + 64 * 6 * (MAX_REF_CHARS - 3)


def test_every_write_of_an_effect_is_charged_at_least_what_it_writes(
    tasks: tasks_pb2_grpc.TaskServiceStub,
    worker: worker_pb2_grpc.WorkerServiceStub,
    store: Store,
    keyspace: Probe,
) -> None:
    """An effect's slot, its record (UNKNOWN opens a reconciliation; COMMITTED keeps the
    downstream's reference and etag) and a resolution: the longest text each allows, in the
    characters a stored record writes longest. RecordEffect and ResolveEffect were charged
    nothing, so a slot charged 3 KB wrote 19 KB."""
    tasks.CreateTask(_create(_id(0), queue="q" * 64))
    fence = _claim(worker, "q" * 64)
    longest = {"external_ref": "\x01" * MAX_REF_CHARS, "etag": "\x01" * MAX_ETAG_CHARS}

    def prepared(slot: str) -> str:
        prepare = worker_pb2.PrepareEffectRequest(
            fence=fence, node_id="n" * LONG, effect_slot=slot, payload_digest=digest_of(b"p")
        )
        _, answer = _within_charge(store, keyspace, "PrepareEffect", worker.PrepareEffect, prepare)
        unknown = worker_pb2.RecordEffectRequest(
            fence=fence,
            effect_id=answer.effect_id,
            state=types_pb2.EFFECT_STATE_UNKNOWN,
            reconcile_principal="" if slot == "recorded" else "anonymous",
        )
        _within_charge(store, keyspace, "RecordEffect", worker.RecordEffect, unknown)
        return unknown.effect_id

    record = worker_pb2.RecordEffectRequest(
        fence=fence,
        effect_id=prepared("recorded"),
        state=types_pb2.EFFECT_STATE_COMMITTED,
        **longest,
    )
    written, _ = _within_charge(store, keyspace, "RecordEffect", worker.RecordEffect, record)
    assert written > 12_000  # the reference and etag were kept, escaped
    resolve = worker_pb2.ResolveEffectRequest(
        effect_id=prepared("resolved"),
        resolution=types_pb2.EFFECT_STATE_COMMITTED,
        reason="\x01" * 1024,
        **longest,
    )
    worker.Release(worker_pb2.ReleaseRequest(fence=fence))
    written, answer = _within_charge(
        store, keyspace, "ResolveEffect", worker.ResolveEffect, resolve
    )
    assert answer.effect.state == types_pb2.EFFECT_STATE_COMMITTED
    assert written > 18_000  # and the reason


def _within_charge(
    store: Store, keyspace: Probe, method: str, call: Any, request: Any, *, free: int = 0
) -> tuple[int, Any]:
    """The bytes one call wrote, asserted to be at most what its caller was charged and
    ``free`` (what the call writes uncharged), and its answer."""
    answers: list[Any] = []
    written = _written(store, keyspace, lambda: answers.append(call(request)))
    charged = _charged(f"WorkerService/{method}", request)
    assert 0 < written <= charged + free, (method, written, charged, answers)
    return written, answers[0]


def _far() -> Timestamp:
    """A not_before a month away: the upstreams stay DELAYED, as an attacker would keep them."""
    stamp = Timestamp()
    stamp.GetCurrentTime()
    stamp.seconds += 30 * 86400
    return stamp
