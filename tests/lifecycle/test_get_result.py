"""GetResult: a reviewer reads the canonical result of a revision, with the attempt and fence
that committed it, through a real server (and the SDK)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import grpc
import pytest

from coordinator.domain.digests import digest_of
from coordinator.domain.records import ResultRecord, decode
from coordinator.domain.states import Outcome
from coordinator.errors import NotFound
from coordinator.sdk import ResultInfo, WorkerClient
from coordinator.store import Store
from coordinator.store.lifecycle.results import LISTED_REVISIONS
from coordinator.v1 import tasks_pb2, tasks_pb2_grpc
from tests.conftest import GRPC_OPTIONS
from tests.lifecycle.support import RESULT, claim, create, finish, snapshot, who

PM = who("reviewer", "pm")
DIGEST = "sha256:" + "ab" * 32


@pytest.fixture
def client(server: str) -> Iterator[WorkerClient]:
    """The SDK (insecure mode: every role; tests/auth checks who may call GetResult)."""
    with WorkerClient(server, principal="reviewer", channel_options=GRPC_OPTIONS) as sdk:
        yield sdk


def _stored(store: Store, task_id: str, revision: int) -> ResultRecord:
    kv = store.ctx.kv.get(store.ctx.keys.result(task_id, revision))
    assert kv is not None
    return decode(ResultRecord, kv.value)


def test_the_result_of_a_revision_is_what_its_commit_wrote(
    store: Store, client: WorkerClient
) -> None:
    create(store, "t", review=True)
    fence = claim(store, "t", "w1")
    task = store.tasks.get("t")
    done = store.acceptance.commit(
        fence,
        principal="w1",
        input_digest=task.input_digest,
        result_digest=digest_of(b"report v1"),
        result=b"report v1",
        result_ref="s3://bucket/report-v1",
        evidence=("job-1", "log:/var/log/job-1"),
    )
    assert done.verdict.outcome is Outcome.COMMITTED
    stored = _stored(store, "t", 1)

    got = client.get_result("t")

    assert got == ResultInfo(
        task_id="t",
        revision=1,
        result=b"report v1",
        result_ref="s3://bucket/report-v1",
        result_digest=digest_of(b"report v1"),
        attempt_id=fence.attempt_id,
        claim_generation=fence.claim_generation,
        scheduler_epoch=1,
        commit_id=f"{fence.attempt_id}@{fence.claim_generation}",
        owner_id="w1",
        committed_at=got.committed_at,
        evidence=("job-1", "log:/var/log/job-1"),
    )
    assert got.committed_at is not None
    assert got.committed_at.timestamp() == pytest.approx(stored.committed_at, abs=1e-6)
    assert got.commit_id == store.tasks.get("t").result_commit_id
    assert client.get_result("t", revision=1) == got


def test_an_older_revision_keeps_its_own_result(store: Store, client: WorkerClient) -> None:
    create(store, "t", review=True)
    finish(store, "t", "w1")
    store.review.reject("t", revision=1, reviewer="pm", reason="no tests")
    fence = claim(store, "t", "w2")
    task = store.tasks.get("t")
    store.acceptance.commit(
        fence,
        principal="w2",
        input_digest=task.input_digest,
        result_digest=DIGEST,
        result=b"",
        result_ref="s3://bucket/report-v2",
    )
    first, current = client.get_result("t", revision=1), client.get_result("t")
    assert (first.revision, first.owner_id, first.result) == (1, "w1", RESULT)
    assert (current.revision, current.owner_id) == (2, "w2")
    assert (current.result, current.result_ref, current.result_digest) == (
        b"",
        "s3://bucket/report-v2",
        DIGEST,
    )
    assert current.claim_generation == fence.claim_generation > first.claim_generation


def _result_error(tasks: tasks_pb2_grpc.TaskServiceStub, **fields: Any) -> tuple[Any, str]:
    with pytest.raises(grpc.RpcError) as info:
        tasks.GetResult(tasks_pb2.GetResultRequest(**fields), metadata=PM)
    return info.value.code(), info.value.details() or ""


def test_no_result_is_not_found_and_names_the_revisions_that_have_one(
    store: Store, tasks: tasks_pb2_grpc.TaskServiceStub, etcd_client: Any
) -> None:
    create(store, "t", review=True)
    before = snapshot(store, etcd_client)
    assert _result_error(tasks, task_id="t") == (
        grpc.StatusCode.NOT_FOUND,
        "task 't' has no committed result for revision 1 (no revision has one yet); the task "
        "is READY",
    )
    assert _result_error(tasks, task_id="nope") == (
        grpc.StatusCode.NOT_FOUND,
        "task 'nope' does not exist",
    )
    assert _result_error(tasks, task_id="nope", revision=3) == (
        grpc.StatusCode.NOT_FOUND,
        "task 'nope' does not exist",
    )
    code, message = _result_error(tasks, task_id="t", revision=-1)
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert "revision" in message
    code, message = _result_error(tasks, task_id="a b")
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert "task_id" in message
    assert snapshot(store, etcd_client) == before
    # Rejected revisions keep their results; the message lists at most LISTED_REVISIONS.
    for revision in range(1, LISTED_REVISIONS + 2):
        finish(store, "t", "w1")
        store.review.reject("t", revision=revision, reviewer="pm", reason="again")
    current = LISTED_REVISIONS + 2
    listed = ", ".join(str(n) for n in range(current - 1, 1, -1))
    assert _result_error(tasks, task_id="t") == (
        grpc.StatusCode.NOT_FOUND,
        f"task 't' has no committed result for revision {current} "
        f"(revisions with one, latest first: {listed}, ...); the task is READY",
    )
    assert _result_error(tasks, task_id="t", revision=99) == (
        grpc.StatusCode.NOT_FOUND,
        f"task 't' has no committed result for revision 99 "
        f"(revisions with one, latest first: {listed}, ...); the task is READY",
    )
    latest = tasks.GetResult(tasks_pb2.GetResultRequest(task_id="t", revision=current - 1))
    assert latest.result.revision == current - 1


def test_the_sdk_raises_not_found(store: Store, client: WorkerClient) -> None:
    create(store, "t")
    with pytest.raises(NotFound) as info:
        client.get_result("t", revision=2)
    assert str(info.value) == (
        "NOT_FOUND: task 't' has no committed result for revision 2 (no revision has one yet); "
        "the task is READY"
    )
