"""Bad input, one parametrized test per RPC: the exact status code, a message that names the
field, and nothing written.

Every case runs against a live claim (task "t-1", held by worker-a), so the one bad field is the
only thing wrong with the request. "Nothing written" is checked on etcd itself: the number of
keys under the test's prefix and their highest mod_revision are unchanged.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

import grpc
import pytest
from google.protobuf.message import Message

from coordinator.domain.digests import digest_of
from coordinator.domain.validation import MAX_INPUT_BYTES, MAX_RESULT_BYTES, MAX_TEXT_CHARS
from coordinator.v1 import (
    admin_pb2,
    admin_pb2_grpc,
    tasks_pb2,
    tasks_pb2_grpc,
    types_pb2,
    worker_pb2,
    worker_pb2_grpc,
)
from tests import helpers
from tests.helpers import Probe

Claim = worker_pb2.ClaimResponse
Call = Callable[..., Any]

INVALID = grpc.StatusCode.INVALID_ARGUMENT
NOT_FOUND = grpc.StatusCode.NOT_FOUND
PRECONDITION = grpc.StatusCode.FAILED_PRECONDITION
WORKER_A = (("x-coordinator-principal", "worker-a"),)

# Every bad request is sent as the claim's holder, so the one bad field is all that is wrong.
refused = partial(helpers.refused, metadata=WORKER_A)

RESULT = b"a result"
LONG_ID = "t" * 129
LONG_TEXT = "x" * (MAX_TEXT_CHARS + 1)
BIG_RESULT = b"r" * (MAX_RESULT_BYTES + 1)
BIG_INPUT = b"i" * (MAX_INPUT_BYTES + 1)
OTHER = digest_of(b"something else")
REF = "s3://bucket/result.json"
SAME_INPUT = b"<the claimed task's current input>"  # replaced by it in test_update_input


def fence(claim: Claim, **changes: Any) -> types_pb2.Fence:
    """The live claim's fence with some parts changed."""
    copy = types_pb2.Fence()
    copy.CopyFrom(claim.fence)
    for name, value in changes.items():
        setattr(copy, name, value)
    return copy


# Bad fences, checked at every acceptance point: (id, fence changes, code, text in the message).
# None as the changes means "no fence at all".
_BAD_FENCES: list[tuple[str, dict[str, Any] | None, grpc.StatusCode, str]] = [
    ("empty-task", {"task_id": ""}, INVALID, "fence.task_id"),
    ("long-task", {"task_id": LONG_ID}, INVALID, "fence.task_id"),
    ("bad-task", {"task_id": "a/b"}, INVALID, "fence.task_id"),
    ("unknown-task", {"task_id": "nope"}, NOT_FOUND, "'nope'"),
    ("empty-attempt", {"attempt_id": ""}, INVALID, "fence.attempt_id"),
    ("long-attempt", {"attempt_id": "a" * 65}, INVALID, "fence.attempt_id"),
    ("unknown-attempt", {"attempt_id": "a9-0"}, NOT_FOUND, "a9-0"),
    ("no-generation", {"claim_generation": 0}, INVALID, "fence.claim_generation"),
    ("neg-generation", {"claim_generation": -3}, INVALID, "fence.claim_generation"),
    ("missing-epoch", {"scheduler_epoch": 0}, INVALID, "fence.scheduler_epoch"),
    ("neg-epoch", {"scheduler_epoch": -1}, INVALID, "fence.scheduler_epoch"),
    ("neg-cancel", {"cancel_generation": -1}, INVALID, "fence.cancel_generation"),
    # Never handed out (the task was never cancelled): a forged fence, not a cancellation.
    ("forged-cancel", {"cancel_generation": 7}, INVALID, "cancel_generation 7 was never handed"),
    ("no-fence", None, INVALID, "fence is required"),
]
FENCED_ARGS = ("changes", "fields", "code", "named")


def fence_cases(*own: Any, skip: tuple[str, ...] = ()) -> list[Any]:
    """Every bad fence (with no other field changed, but the ids in ``skip``), plus the RPC's
    ``own`` cases."""
    shared = [
        pytest.param(ch, {}, code, named, id=i)
        for i, ch, code, named in _BAD_FENCES
        if i not in skip
    ]
    return [*shared, *own]


def with_fence(claim: Claim, changes: dict[str, Any] | None) -> dict[str, Any]:
    """``fence=`` for a request: the changed live fence, or none at all."""
    return {} if changes is None else {"fence": fence(claim, **changes)}


@pytest.mark.parametrize(
    ("fields", "code", "named"),
    [
        pytest.param({"task_id": ""}, INVALID, "task_id", id="empty-id"),
        pytest.param({"task_id": LONG_ID}, INVALID, "task_id", id="long-id"),
        pytest.param({"task_id": "a/b"}, INVALID, "task_id", id="bad-id"),
        pytest.param({"task_id": "nope"}, NOT_FOUND, "'nope'", id="unknown-task"),
        pytest.param({"ttl_seconds": 0}, INVALID, "ttl_seconds", id="ttl-0"),
        pytest.param({"ttl_seconds": -5}, INVALID, "ttl_seconds", id="ttl-negative"),
        pytest.param({"scheduler_epoch": 0}, INVALID, "scheduler_epoch", id="missing-epoch"),
        pytest.param({"scheduler_epoch": -1}, INVALID, "scheduler_epoch", id="neg-epoch"),
        pytest.param(
            {"expected_state_version": -1}, INVALID, "expected_state_version", id="neg-version"
        ),
    ],
)
def test_claim(
    fields: dict[str, Any],
    code: grpc.StatusCode,
    named: str,
    claimed: Claim,
    worker: worker_pb2_grpc.WorkerServiceStub,
    keyspace: Probe,
) -> None:
    request = worker_pb2.ClaimRequest(
        **{"task_id": "t-1", "scheduler_epoch": 1, "ttl_seconds": 10, **fields}
    )
    refused(worker.Claim, request, code, named, keyspace)


@pytest.mark.parametrize(
    ("fields", "code", "named"),
    [
        pytest.param({"queue": "a/b"}, INVALID, "queue", id="bad-queue"),
        pytest.param({"queue": "q" * 65}, INVALID, "queue", id="long-queue"),
        pytest.param({"ttl_seconds": 0}, INVALID, "ttl_seconds", id="ttl-0"),
        pytest.param({"scheduler_epoch": 0}, INVALID, "scheduler_epoch", id="missing-epoch"),
    ],
)
def test_claim_next(
    fields: dict[str, Any],
    code: grpc.StatusCode,
    named: str,
    claimed: Claim,
    worker: worker_pb2_grpc.WorkerServiceStub,
    keyspace: Probe,
) -> None:
    request = worker_pb2.ClaimNextRequest(**{"scheduler_epoch": 1, "ttl_seconds": 10, **fields})
    refused(worker.ClaimNext, request, code, named, keyspace)


@pytest.mark.parametrize(
    FENCED_ARGS,
    fence_cases(
        pytest.param({}, {"progress": LONG_TEXT}, INVALID, "progress", id="long-progress"),
        # An unknown task is answered FENCED from the claimed index, unread:
        # test_renew_of_an_unknown_task_is_fenced_and_writes_nothing.
        skip=("unknown-task",),
    ),
)
def test_renew(
    changes: dict[str, Any] | None,
    fields: dict[str, Any],
    code: grpc.StatusCode,
    named: str,
    claimed: Claim,
    worker: worker_pb2_grpc.WorkerServiceStub,
    keyspace: Probe,
) -> None:
    request = worker_pb2.RenewRequest(**with_fence(claimed, changes), **fields)
    refused(worker.Renew, request, code, named, keyspace)


def test_renew_of_an_unknown_task_is_fenced_and_writes_nothing(
    claimed: Claim, worker: worker_pb2_grpc.WorkerServiceStub, keyspace: Probe
) -> None:
    before = keyspace()
    request = worker_pb2.RenewRequest(**with_fence(claimed, {"task_id": "nope"}))
    response = worker.Renew(request)
    assert response.outcome == types_pb2.OUTCOME_FENCED
    assert response.reason == 0  # FenceReason NONE
    assert "'nope'" in response.message
    assert keyspace() == before


@pytest.mark.parametrize(
    FENCED_ARGS,
    fence_cases(
        pytest.param({}, {"tool": LONG_TEXT}, INVALID, "tool", id="long-tool"),
        pytest.param({}, {"action": LONG_TEXT}, INVALID, "action", id="long-action"),
    ),
)
def test_authorize_tool(
    changes: dict[str, Any] | None,
    fields: dict[str, Any],
    code: grpc.StatusCode,
    named: str,
    claimed: Claim,
    worker: worker_pb2_grpc.WorkerServiceStub,
    keyspace: Probe,
) -> None:
    request = worker_pb2.AuthorizeToolRequest(**with_fence(claimed, changes), **fields)
    refused(worker.AuthorizeTool, request, code, named, keyspace)


# Result payloads that StageResult and Commit both refuse: (id, fields, text in the message).
_BAD_RESULTS: list[tuple[str, dict[str, Any], str]] = [
    ("malformed-digest", {"result_digest": "sha256:xyz"}, "result_digest"),
    ("md5-digest", {"result_digest": "md5:" + "0" * 32}, "result_digest"),
    ("upper-hex", {"result_digest": "sha256:" + "A" * 64}, "result_digest"),
    ("short-digest", {"result_digest": "sha256:" + "0" * 63}, "result_digest"),
    ("digest-not-of-bytes", {"result_digest": OTHER}, "result_digest"),
    ("digest-of-nothing", {"result": b"", "result_digest": OTHER}, "result_digest"),
    ("oversized-result", {"result": BIG_RESULT, "result_digest": ""}, "result"),
    (
        "ref-without-digest",
        {"result": b"", "result_digest": "", "result_ref": REF},
        "result_digest",
    ),
    ("long-ref", {"result_ref": "s3://" + "k" * 2048}, "result_ref"),
]


def result_cases() -> list[Any]:
    """Every bad result payload (with the live fence), as FENCED_ARGS cases."""
    return [pytest.param({}, fields, INVALID, named, id=i) for i, fields, named in _BAD_RESULTS]


@pytest.mark.parametrize(FENCED_ARGS, fence_cases(*result_cases()))
def test_stage_result(
    changes: dict[str, Any] | None,
    fields: dict[str, Any],
    code: grpc.StatusCode,
    named: str,
    claimed: Claim,
    worker: worker_pb2_grpc.WorkerServiceStub,
    keyspace: Probe,
) -> None:
    payload = {"result": RESULT, "result_digest": digest_of(RESULT), **fields}
    request = worker_pb2.StageResultRequest(**with_fence(claimed, changes), **payload)
    refused(worker.StageResult, request, code, named, keyspace)


@pytest.mark.parametrize(
    FENCED_ARGS,
    fence_cases(
        *result_cases(),
        pytest.param({}, {"input_digest": ""}, INVALID, "input_digest", id="no-input-digest"),
        pytest.param(
            {}, {"input_digest": "sha256:nothex"}, INVALID, "input_digest", id="bad-input-digest"
        ),
    ),
)
def test_commit(
    changes: dict[str, Any] | None,
    fields: dict[str, Any],
    code: grpc.StatusCode,
    named: str,
    claimed: Claim,
    worker: worker_pb2_grpc.WorkerServiceStub,
    keyspace: Probe,
) -> None:
    payload = {
        "input_digest": claimed.input_digest,
        "result": RESULT,
        "result_digest": digest_of(RESULT),
        **fields,
    }
    request = worker_pb2.CommitRequest(**with_fence(claimed, changes), **payload)
    refused(worker.Commit, request, code, named, keyspace)


@pytest.mark.parametrize(
    FENCED_ARGS,
    fence_cases(pytest.param({}, {"reason": LONG_TEXT}, INVALID, "reason", id="long-reason")),
)
def test_release(
    changes: dict[str, Any] | None,
    fields: dict[str, Any],
    code: grpc.StatusCode,
    named: str,
    claimed: Claim,
    worker: worker_pb2_grpc.WorkerServiceStub,
    keyspace: Probe,
) -> None:
    request = worker_pb2.ReleaseRequest(**with_fence(claimed, changes), **fields)
    refused(worker.Release, request, code, named, keyspace)


@pytest.mark.parametrize(
    ("fields", "code", "named"),
    [
        pytest.param({"task_id": LONG_ID}, INVALID, "task_id", id="long-id"),
        pytest.param({"task_id": "a b"}, INVALID, "task_id", id="bad-id"),
        pytest.param({"task_id": "t-1"}, grpc.StatusCode.ALREADY_EXISTS, "'t-1'", id="taken-id"),
        pytest.param({"queue": "a/b"}, INVALID, "queue", id="bad-queue"),
        pytest.param({"task_id": ".."}, INVALID, "task_id must not be '.' or '..'", id="dotdot-id"),
        pytest.param({"task_id": "."}, INVALID, "task_id must not be '.' or '..'", id="dot-id"),
        pytest.param({"queue": ".."}, INVALID, "queue must not be '.' or '..'", id="dotdot-queue"),
        pytest.param({"thread_key": "../x"}, INVALID, "thread_key must not be", id="dotdot-thread"),
        pytest.param({"priority": 1000}, INVALID, "priority", id="priority-too-high"),
        pytest.param({"priority": -1}, INVALID, "priority", id="priority-negative"),
        pytest.param({"input": BIG_INPUT}, INVALID, "input", id="oversized-input"),
        pytest.param(
            {"input": b"x", "input_digest": OTHER}, INVALID, "input_digest", id="mismatch"
        ),
        pytest.param({"input_digest": OTHER}, INVALID, "input_digest", id="digest-of-nothing"),
        pytest.param(
            {"input": b"x", "input_digest": "sha256:" + "G" * 64},
            INVALID,
            "input_digest",
            id="malformed-digest",
        ),
    ],
)
def test_create_task(
    fields: dict[str, Any],
    code: grpc.StatusCode,
    named: str,
    claimed: Claim,
    tasks: tasks_pb2_grpc.TaskServiceStub,
    keyspace: Probe,
) -> None:
    refused(tasks.CreateTask, tasks_pb2.CreateTaskRequest(**fields), code, named, keyspace)


@pytest.mark.parametrize(
    ("task_id", "code", "named"),
    [
        pytest.param("", INVALID, "task_id is required", id="empty-id"),
        pytest.param(LONG_ID, INVALID, "task_id", id="long-id"),
        pytest.param("nope", NOT_FOUND, "'nope'", id="unknown-task"),
    ],
)
def test_get_task(
    task_id: str,
    code: grpc.StatusCode,
    named: str,
    claimed: Claim,
    tasks: tasks_pb2_grpc.TaskServiceStub,
    keyspace: Probe,
) -> None:
    refused(tasks.GetTask, tasks_pb2.GetTaskRequest(task_id=task_id), code, named, keyspace)


@pytest.mark.parametrize(
    ("fields", "named"),
    [
        pytest.param({"page_size": -1}, "page_size", id="page-size-negative"),
        pytest.param({"page_size": 1001}, "page_size", id="page-size-too-big"),
        pytest.param({"state": 99}, "state", id="unknown-state"),
        pytest.param({"queue": "a/b"}, "queue", id="bad-queue"),
        pytest.param({"page_token": "a/b"}, "page_token", id="bad-token"),
    ],
)
def test_list_tasks(
    fields: dict[str, Any],
    named: str,
    claimed: Claim,
    tasks: tasks_pb2_grpc.TaskServiceStub,
    keyspace: Probe,
) -> None:
    refused(tasks.ListTasks, tasks_pb2.ListTasksRequest(**fields), INVALID, named, keyspace)


@pytest.mark.parametrize(
    ("fields", "code", "named"),
    [
        pytest.param({}, INVALID, "task_id is required", id="empty-id"),
        pytest.param({"task_id": "nope"}, NOT_FOUND, "'nope'", id="unknown-task"),
        pytest.param({"task_id": "t-1", "reason": LONG_TEXT}, INVALID, "reason", id="long-reason"),
    ],
)
def test_cancel_task(
    fields: dict[str, Any],
    code: grpc.StatusCode,
    named: str,
    claimed: Claim,
    tasks: tasks_pb2_grpc.TaskServiceStub,
    keyspace: Probe,
) -> None:
    refused(tasks.CancelTask, tasks_pb2.CancelTaskRequest(**fields), code, named, keyspace)


@pytest.mark.parametrize(
    ("fields", "code", "named"),
    [
        pytest.param({"task_id": ""}, INVALID, "task_id is required", id="empty-id"),
        pytest.param({"task_id": "nope"}, NOT_FOUND, "'nope'", id="unknown-task"),
        pytest.param({"input": BIG_INPUT}, INVALID, "input", id="oversized-input"),
        pytest.param({"input_digest": OTHER}, INVALID, "input_digest", id="digest-mismatch"),
        pytest.param({"expected_revision": -1}, INVALID, "expected_revision", id="neg-revision"),
        pytest.param({"expected_revision": 7}, PRECONDITION, "expected 7", id="stale-revision"),
        pytest.param({"input": SAME_INPUT}, INVALID, "input", id="identical-input"),
    ],
)
def test_update_input(
    fields: dict[str, Any],
    code: grpc.StatusCode,
    named: str,
    claimed: Claim,
    tasks: tasks_pb2_grpc.TaskServiceStub,
    keyspace: Probe,
) -> None:
    fields = {k: claimed.input if v == SAME_INPUT else v for k, v in fields.items()}
    request = tasks_pb2.UpdateInputRequest(**{"task_id": "t-1", "input": b"v2", **fields})
    refused(tasks.UpdateInput, request, code, named, keyspace)


@pytest.mark.parametrize(
    ("method", "request_", "code", "named"),
    [
        pytest.param(
            "BumpEpoch",
            admin_pb2.BumpEpochRequest(expected_epoch=-1),
            INVALID,
            "expected_epoch",
            id="bump-neg-expected",
        ),
        pytest.param(
            "BumpEpoch",
            admin_pb2.BumpEpochRequest(expected_epoch=9),
            PRECONDITION,
            "expected 9",
            id="bump-epoch-moved-on",
        ),
        pytest.param(
            "PauseClaims",
            admin_pb2.PauseClaimsRequest(reason=LONG_TEXT),
            INVALID,
            "reason",
            id="pause-long-reason",
        ),
    ],
)
def test_admin(
    method: str,
    request_: Message,
    code: grpc.StatusCode,
    named: str,
    claimed: Claim,
    admin: admin_pb2_grpc.AdminServiceStub,
    keyspace: Probe,
) -> None:
    refused(getattr(admin, method), request_, code, named, keyspace)


@pytest.mark.parametrize(
    "principal", ["", "x" * 129, "has space", "slash/ed", "semi;colon"], ids=repr
)
def test_malformed_principal(
    principal: str, claimed: Claim, worker: worker_pb2_grpc.WorkerServiceStub, keyspace: Probe
) -> None:
    before = keyspace()
    metadata = (("x-coordinator-principal", principal),)
    with pytest.raises(grpc.RpcError) as info:
        worker.Renew(worker_pb2.RenewRequest(fence=claimed.fence), metadata=metadata)
    assert info.value.code() == INVALID
    assert "x-coordinator-principal" in str(info.value.details())
    assert keyspace() == before


def test_absent_principal_is_anonymous(
    tasks: tasks_pb2_grpc.TaskServiceStub, worker: worker_pb2_grpc.WorkerServiceStub
) -> None:
    tasks.CreateTask(tasks_pb2.CreateTaskRequest(task_id="anon"))
    claim = worker.Claim(worker_pb2.ClaimRequest(task_id="anon", scheduler_epoch=1, ttl_seconds=5))
    assert claim.outcome == types_pb2.OUTCOME_CLAIMED
    assert tasks.GetTask(tasks_pb2.GetTaskRequest(task_id="anon")).task.owner_id == "anonymous"
