"""WorkerService.Fail: the holder reports its attempt failed. An acceptance point: the attempt
ends FAILED with the error in the txn that compares the fence; a fenced Fail writes nothing."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import grpc
import pytest
from google.protobuf.duration_pb2 import Duration

from coordinator.domain.records import AttemptRecord, EventRecord, decode
from coordinator.domain.states import AttemptEnd, Op, TaskState
from coordinator.server import PRINCIPAL_METADATA_KEY
from coordinator.store import Store
from coordinator.v1 import (
    admin_pb2,
    admin_pb2_grpc,
    tasks_pb2,
    tasks_pb2_grpc,
    types_pb2,
    worker_pb2,
    worker_pb2_grpc,
)

A = ((PRINCIPAL_METADATA_KEY, "worker-a"),)
B = ((PRINCIPAL_METADATA_KEY, "worker-b"),)
Probe = Callable[[], tuple[int, int]]


def _fail(fence: types_pb2.Fence, **fields: Any) -> worker_pb2.FailRequest:
    fields.setdefault("error_code", "TimeoutError")
    return worker_pb2.FailRequest(fence=fence, **fields)


def _events(store: Store, etcd_client: Any, task_id: str) -> list[EventRecord]:
    found = dict(
        (meta.key.decode(), value)
        for value, meta in etcd_client.get_prefix(store.ctx.keys.events_prefix(task_id))
    )
    return [decode(EventRecord, found[key]) for key in sorted(found)]


def _attempt(store: Store, etcd_client: Any, fence: types_pb2.Fence) -> AttemptRecord:
    value, _ = etcd_client.get(store.ctx.keys.attempt(fence.task_id, fence.attempt_id))
    return decode(AttemptRecord, value)


def test_a_retryable_failure_closes_the_attempt_with_its_error_and_requeues(
    store: Store,
    etcd_client: Any,
    worker: worker_pb2_grpc.WorkerServiceStub,
    tasks: tasks_pb2_grpc.TaskServiceStub,
    claimed: worker_pb2.ClaimResponse,
) -> None:
    request = _fail(
        claimed.fence, retryable=True, error_message="model timed out", error_details=b"trace"
    )
    answer = worker.Fail(request, metadata=A)
    assert (answer.outcome, answer.state) == (types_pb2.OUTCOME_OK, types_pb2.TASK_STATE_READY)
    assert answer.HasField("next_eligible_at")

    attempt = _attempt(store, etcd_client, claimed.fence)
    assert (attempt.end, attempt.error_code, attempt.error_message, attempt.error_details) == (
        AttemptEnd.FAILED,
        "TimeoutError",
        "model timed out",
        b"trace",
    )
    last = _events(store, etcd_client, "t-1")[-1]
    assert (last.op, last.from_state, last.to_state) == (
        Op.FAIL,
        TaskState.CLAIMED,
        TaskState.READY,
    )
    assert last.detail == "TimeoutError: model timed out"
    got = tasks.GetTask(tasks_pb2.GetTaskRequest(task_id="t-1"))
    assert [(a.end, a.error_code) for a in got.attempts] == [
        (types_pb2.ATTEMPT_END_FAILED, "TimeoutError")
    ]
    # The failed holder's later calls are refused, naming its own failure.
    renew = worker.Renew(worker_pb2.RenewRequest(fence=claimed.fence), metadata=A)
    assert (renew.outcome, renew.reason) == (
        types_pb2.OUTCOME_FENCED,
        types_pb2.FENCE_REASON_FAILED,
    )
    again = worker.ClaimNext(
        worker_pb2.ClaimNextRequest(scheduler_epoch=1, ttl_seconds=30), metadata=B
    )
    assert again.outcome == types_pb2.OUTCOME_CLAIMED
    assert again.fence.task_id == "t-1"


def test_a_non_retryable_failure_dead_letters_the_task_at_once(
    store: Store,
    etcd_client: Any,
    worker: worker_pb2_grpc.WorkerServiceStub,
    claimed: worker_pb2.ClaimResponse,
) -> None:
    answer = worker.Fail(_fail(claimed.fence, retryable=False, error_code="BadInput"), metadata=A)
    assert (answer.outcome, answer.state) == (types_pb2.OUTCOME_OK, types_pb2.TASK_STATE_FAILED)
    assert not answer.HasField("next_eligible_at")
    assert store.tasks.get("t-1").state is TaskState.FAILED
    last = _events(store, etcd_client, "t-1")[-1]
    assert (last.op, last.to_state) == (Op.DEAD_LETTER, TaskState.FAILED)
    claim = worker.Claim(
        worker_pb2.ClaimRequest(task_id="t-1", scheduler_epoch=1, ttl_seconds=30), metadata=B
    )
    assert claim.outcome == types_pb2.OUTCOME_NOT_CLAIMABLE


def _superseded(store: Store, fence: types_pb2.Fence) -> None:
    """Expire the claim (its lease revoked, as etcd does at expiry) and let another take it."""
    store.ctx.kv.revoke(store.tasks.get(fence.task_id).lease_id)
    taken = store.claims.claim(fence.task_id, principal="worker-b", epoch=1, ttl=30)
    assert taken.fence is not None, taken.verdict


def _expired(store: Store, fence: types_pb2.Fence) -> None:
    """Expire the claim and let the reclaimer put the task back."""
    store.ctx.kv.revoke(store.tasks.get(fence.task_id).lease_id)
    store.reclaimer.reclaim(fence.task_id)
    assert store.tasks.get(fence.task_id).state is TaskState.READY


def _epoch_bumped(store: Store, fence: types_pb2.Fence) -> None:
    store.admin.bump_epoch()


@pytest.mark.parametrize(
    ("fence_it", "reason"),
    [
        (_superseded, types_pb2.FENCE_REASON_SUPERSEDED),
        (_expired, types_pb2.FENCE_REASON_LEASE_EXPIRED),
        (_epoch_bumped, types_pb2.FENCE_REASON_EPOCH_CHANGED),
    ],
    ids=["superseded", "expired", "epoch-bumped"],
)
def test_a_fenced_fail_writes_nothing(
    store: Store,
    worker: worker_pb2_grpc.WorkerServiceStub,
    claimed: worker_pb2.ClaimResponse,
    keyspace: Probe,
    fence_it: Callable[[Store, types_pb2.Fence], None],
    reason: int,
) -> None:
    fence_it(store, claimed.fence)
    before = keyspace()
    for retryable in (True, False):
        answer = worker.Fail(_fail(claimed.fence, retryable=retryable), metadata=A)
        assert (answer.outcome, answer.reason) == (types_pb2.OUTCOME_FENCED, reason)
        assert answer.state == types_pb2.TASK_STATE_UNSPECIFIED
    assert keyspace() == before


def test_another_principals_fail_is_permission_denied(
    worker: worker_pb2_grpc.WorkerServiceStub, claimed: worker_pb2.ClaimResponse, keyspace: Probe
) -> None:
    before = keyspace()
    with pytest.raises(grpc.RpcError) as refused:
        worker.Fail(_fail(claimed.fence), metadata=B)
    assert refused.value.code() is grpc.StatusCode.PERMISSION_DENIED
    assert keyspace() == before


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"error_code": ""}, "error_code is required"),
        ({"error_code": "has space"}, "error_code must be 1-128 characters"),
        ({"error_code": "x" * 129}, "error_code must be 1-128 characters"),
        ({"error_message": "m" * 1025}, "error_message is 1025 characters"),
        ({"error_details": b"d" * (16 * 1024 + 1)}, "error_details is 16385 bytes"),
        ({"requeue_delay": Duration(seconds=-1)}, "requeue_delay must be 0 s to 86400 s, got -1 s"),
        (
            {"requeue_delay": Duration(seconds=86401)},
            "requeue_delay must be 0 s to 86400 s, got 86401 s",
        ),
        (
            {"shutdown": True, "retryable": False},
            "shutdown gives the task back for another attempt: it needs retryable true",
        ),
    ],
    ids=[
        "no-code",
        "bad-code",
        "long-code",
        "long-message",
        "big-details",
        "neg-delay",
        "delay",
        "shutdown-not-retryable",
    ],
)
def test_bad_fail_requests_are_refused_and_write_nothing(
    worker: worker_pb2_grpc.WorkerServiceStub,
    claimed: worker_pb2.ClaimResponse,
    keyspace: Probe,
    fields: dict[str, Any],
    field: str,
) -> None:
    before = keyspace()
    with pytest.raises(grpc.RpcError) as refused:
        worker.Fail(_fail(claimed.fence, **fields), metadata=A)
    assert refused.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert field in (refused.value.details() or "")
    assert keyspace() == before


def test_a_fail_without_a_fence_is_refused(
    worker: worker_pb2_grpc.WorkerServiceStub, admin: admin_pb2_grpc.AdminServiceStub
) -> None:
    with pytest.raises(grpc.RpcError) as refused:
        worker.Fail(worker_pb2.FailRequest(error_code="E"), metadata=A)
    assert refused.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert "fence is required" in (refused.value.details() or "")
    assert admin.GetEpoch(admin_pb2.GetEpochRequest()).epoch == 1
