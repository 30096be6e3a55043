"""The worker's path over a real gRPC channel: claim, renew, authorize, stage, commit.

Outcomes are checked on the wire (enum values), the owner comes from the caller's metadata, and
a refused call leaves the task exactly as it was.
"""

from __future__ import annotations

from collections.abc import Callable

import grpc
import pytest

from coordinator.domain.digests import digest_of
from coordinator.v1 import (
    admin_pb2,
    admin_pb2_grpc,
    tasks_pb2,
    tasks_pb2_grpc,
    types_pb2,
    worker_pb2,
    worker_pb2_grpc,
)

INPUT = b"the task input"
RESULT = b'{"summary": "fenced claims"}'
WORKER_A = (("x-coordinator-principal", "worker-a"),)
WORKER_B = (("x-coordinator-principal", "worker-b"),)


def _commit(fence: types_pb2.Fence, input_digest: str) -> worker_pb2.CommitRequest:
    return worker_pb2.CommitRequest(
        fence=fence, input_digest=input_digest, result_digest=digest_of(RESULT), result=RESULT
    )


def test_claim_renew_authorize_stage_commit(
    tasks: tasks_pb2_grpc.TaskServiceStub,
    worker: worker_pb2_grpc.WorkerServiceStub,
    admin: admin_pb2_grpc.AdminServiceStub,
) -> None:
    created = tasks.CreateTask(tasks_pb2.CreateTaskRequest(task_id="job-1", input=INPUT)).task
    assert created.state == types_pb2.TASK_STATE_READY
    assert created.input_digest == digest_of(INPUT)
    epoch = admin.GetEpoch(admin_pb2.GetEpochRequest()).epoch

    claim = worker.Claim(
        worker_pb2.ClaimRequest(task_id="job-1", scheduler_epoch=epoch, ttl_seconds=30),
        metadata=WORKER_A,
    )
    assert claim.outcome == types_pb2.OUTCOME_CLAIMED
    fence = claim.fence
    assert (fence.task_id, fence.scheduler_epoch, fence.cancel_generation) == ("job-1", epoch, 0)
    assert fence.claim_generation == claim.state_version > created.state_version
    assert claim.input == INPUT and claim.input_digest == digest_of(INPUT)
    assert claim.ttl_seconds == 30 and claim.attempt == 1
    assert claim.lease_remaining.ToSeconds() == 30  # a fresh lease: all of it
    assert claim.lease_expires_at.seconds > 0 and claim.claim_deadline.seconds > 0

    renew = worker.Renew(worker_pb2.RenewRequest(fence=fence, progress="step-1"), metadata=WORKER_A)
    assert renew.outcome == types_pb2.OUTCOME_OK, renew.message
    assert renew.ttl_seconds > 0 and renew.lease_expires_at.seconds > 0

    tool = worker.AuthorizeTool(
        worker_pb2.AuthorizeToolRequest(fence=fence, tool="git", action="push"), metadata=WORKER_A
    )
    assert tool.outcome == types_pb2.OUTCOME_OK, tool.message

    staged = worker.StageResult(
        worker_pb2.StageResultRequest(fence=fence, result_digest=digest_of(RESULT), result=RESULT),
        metadata=WORKER_A,
    )
    assert staged.outcome == types_pb2.OUTCOME_OK and staged.current

    commit = worker.Commit(_commit(fence, digest_of(INPUT)), metadata=WORKER_A)
    assert commit.outcome == types_pb2.OUTCOME_COMMITTED, commit.message
    assert commit.result_commit_id == f"{fence.attempt_id}@{fence.claim_generation}"
    assert commit.state == types_pb2.TASK_STATE_DONE

    # A retry after a lost response is COMMITTED again, not a conflict.
    retry = worker.Commit(_commit(fence, digest_of(INPUT)), metadata=WORKER_A)
    assert retry.outcome == types_pb2.OUTCOME_COMMITTED
    assert retry.result_commit_id == commit.result_commit_id

    got = tasks.GetTask(tasks_pb2.GetTaskRequest(task_id="job-1"))
    assert got.task.state == types_pb2.TASK_STATE_DONE
    assert got.task.result_digest == digest_of(RESULT)
    assert got.task.owner_id == "worker-a"
    assert [a.end for a in got.attempts] == [types_pb2.ATTEMPT_END_COMMITTED]

    # Once committed, the old fence is refused at every acceptance point.
    late = worker.AuthorizeTool(worker_pb2.AuthorizeToolRequest(fence=fence), metadata=WORKER_A)
    assert late.outcome == types_pb2.OUTCOME_FENCED


def test_second_claimant_gets_already_claimed_and_no_credential(
    claimed: worker_pb2.ClaimResponse, worker: worker_pb2_grpc.WorkerServiceStub
) -> None:
    second = worker.Claim(
        worker_pb2.ClaimRequest(
            task_id="t-1", scheduler_epoch=claimed.fence.scheduler_epoch, ttl_seconds=30
        ),
        metadata=WORKER_B,
    )
    assert second.outcome == types_pb2.OUTCOME_ALREADY_CLAIMED
    assert not second.HasField("fence")
    assert second.input == b""
    assert second.state_version == claimed.fence.claim_generation


@pytest.mark.parametrize("call", ["Renew", "AuthorizeTool", "StageResult", "Commit", "Release"])
def test_another_principal_is_denied_and_nothing_changes(
    call: str,
    claimed: worker_pb2.ClaimResponse,
    tasks: tasks_pb2_grpc.TaskServiceStub,
    worker: worker_pb2_grpc.WorkerServiceStub,
    keyspace: Callable[[], tuple[int, int]],
) -> None:
    fence = claimed.fence
    requests = {
        "Renew": worker_pb2.RenewRequest(fence=fence, progress="p"),
        "AuthorizeTool": worker_pb2.AuthorizeToolRequest(fence=fence, tool="t"),
        "StageResult": worker_pb2.StageResultRequest(fence=fence, result=RESULT),
        "Commit": _commit(fence, claimed.input_digest),
        "Release": worker_pb2.ReleaseRequest(fence=fence),
    }
    before_task = tasks.GetTask(tasks_pb2.GetTaskRequest(task_id="t-1"))
    before_keys = keyspace()

    with pytest.raises(grpc.RpcError) as info:
        getattr(worker, call)(requests[call], metadata=WORKER_B)

    assert info.value.code() == grpc.StatusCode.PERMISSION_DENIED
    assert "worker-b" in str(info.value.details())
    assert keyspace() == before_keys
    assert tasks.GetTask(tasks_pb2.GetTaskRequest(task_id="t-1")) == before_task
    # The rightful owner still holds a working credential.
    ok = worker.Commit(_commit(fence, claimed.input_digest), metadata=WORKER_A)
    assert ok.outcome == types_pb2.OUTCOME_COMMITTED


def test_cancel_reaches_the_holder_as_cancelled(
    claimed: worker_pb2.ClaimResponse,
    tasks: tasks_pb2_grpc.TaskServiceStub,
    worker: worker_pb2_grpc.WorkerServiceStub,
) -> None:
    cancelled = tasks.CancelTask(tasks_pb2.CancelTaskRequest(task_id="t-1", reason="obsolete"))
    assert cancelled.task.state == types_pb2.TASK_STATE_CANCELLED
    assert cancelled.task.cancel_generation == 1

    renew = worker.Renew(worker_pb2.RenewRequest(fence=claimed.fence), metadata=WORKER_A)
    commit = worker.Commit(_commit(claimed.fence, claimed.input_digest), metadata=WORKER_A)
    assert renew.outcome == commit.outcome == types_pb2.OUTCOME_CANCELLED


def test_input_change_makes_the_commit_stale(
    claimed: worker_pb2.ClaimResponse,
    tasks: tasks_pb2_grpc.TaskServiceStub,
    worker: worker_pb2_grpc.WorkerServiceStub,
) -> None:
    updated = tasks.UpdateInput(tasks_pb2.UpdateInputRequest(task_id="t-1", input=b"v2"))
    assert updated.task.revision == 2 and updated.task.state == types_pb2.TASK_STATE_READY

    commit = worker.Commit(_commit(claimed.fence, claimed.input_digest), metadata=WORKER_A)
    assert commit.outcome == types_pb2.OUTCOME_STALE_INPUT
    assert not commit.result_commit_id


def test_release_then_claim_next_supersedes_the_old_fence(
    claimed: worker_pb2.ClaimResponse, worker: worker_pb2_grpc.WorkerServiceStub
) -> None:
    released = worker.Release(
        worker_pb2.ReleaseRequest(fence=claimed.fence, reason="pausing"), metadata=WORKER_A
    )
    assert released.outcome == types_pb2.OUTCOME_OK

    epoch = claimed.fence.scheduler_epoch
    again = worker.ClaimNext(
        worker_pb2.ClaimNextRequest(scheduler_epoch=epoch, ttl_seconds=30), metadata=WORKER_B
    )
    assert again.outcome == types_pb2.OUTCOME_CLAIMED
    assert again.fence.task_id == "t-1" and again.attempt == 2
    assert again.fence.claim_generation > claimed.fence.claim_generation

    stale = worker.Commit(_commit(claimed.fence, claimed.input_digest), metadata=WORKER_A)
    assert stale.outcome == types_pb2.OUTCOME_FENCED
    assert stale.reason == types_pb2.FENCE_REASON_SUPERSEDED

    empty = worker.ClaimNext(
        worker_pb2.ClaimNextRequest(scheduler_epoch=epoch, ttl_seconds=30), metadata=WORKER_A
    )
    assert empty.outcome == types_pb2.OUTCOME_NO_READY_TASK


def test_rollback_controls_fence_old_epoch_and_report_drain(
    claimed: worker_pb2.ClaimResponse,
    tasks: tasks_pb2_grpc.TaskServiceStub,
    worker: worker_pb2_grpc.WorkerServiceStub,
    admin: admin_pb2_grpc.AdminServiceStub,
) -> None:
    old = claimed.fence.scheduler_epoch
    assert admin.PauseClaims(admin_pb2.PauseClaimsRequest(reason="rollback")).claims_paused
    tasks.CreateTask(tasks_pb2.CreateTaskRequest(task_id="t-2"))
    paused = worker.Claim(
        worker_pb2.ClaimRequest(task_id="t-2", scheduler_epoch=old, ttl_seconds=30),
        metadata=WORKER_B,
    )
    assert paused.outcome == types_pb2.OUTCOME_CLAIMS_PAUSED

    drain = admin.DrainStatus(admin_pb2.DrainStatusRequest())
    assert (drain.active_leases, drain.drained) == (1, False)

    with pytest.raises(grpc.RpcError) as info:
        admin.BumpEpoch(admin_pb2.BumpEpochRequest(expected_epoch=old + 5))
    assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert admin.BumpEpoch(admin_pb2.BumpEpochRequest(expected_epoch=old)).epoch == old + 1

    fenced = worker.Commit(_commit(claimed.fence, claimed.input_digest), metadata=WORKER_A)
    assert fenced.outcome == types_pb2.OUTCOME_FENCED
    assert fenced.reason == types_pb2.FENCE_REASON_EPOCH_CHANGED

    released = worker.Release(worker_pb2.ReleaseRequest(fence=claimed.fence), metadata=WORKER_A)
    assert released.outcome == types_pb2.OUTCOME_FENCED  # the old epoch cannot even release
    assert not admin.ResumeClaims(admin_pb2.ResumeClaimsRequest()).claims_paused
    assert admin.GetEpoch(admin_pb2.GetEpochRequest()).epoch == old + 1
