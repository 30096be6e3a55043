"""WorkerService.RenewMany over a real channel: each item answered as Renew would answer it
(outcomes as results, a bad item's error in its own result), bounds refused whole."""

from __future__ import annotations

import grpc

from coordinator.v1 import tasks_pb2, tasks_pb2_grpc, types_pb2, worker_pb2, worker_pb2_grpc
from tests import helpers
from tests.helpers import Probe

WORKER_A = (("x-coordinator-principal", "worker-a"),)


def _claim(
    tasks: tasks_pb2_grpc.TaskServiceStub, worker: worker_pb2_grpc.WorkerServiceStub, task: str
) -> types_pb2.Fence:
    tasks.CreateTask(tasks_pb2.CreateTaskRequest(task_id=task, input=b"x"))
    claim = worker.Claim(
        worker_pb2.ClaimRequest(task_id=task, scheduler_epoch=1, ttl_seconds=30),
        metadata=WORKER_A,
    )
    assert claim.outcome == types_pb2.OUTCOME_CLAIMED, claim.message
    return claim.fence


def test_each_item_is_answered_in_order_and_a_bad_item_only_in_its_own_result(
    tasks: tasks_pb2_grpc.TaskServiceStub,
    worker: worker_pb2_grpc.WorkerServiceStub,
    keyspace: Probe,
) -> None:
    held, released = _claim(tasks, worker, "held"), _claim(tasks, worker, "released")
    worker.Release(worker_pb2.ReleaseRequest(fence=released), metadata=WORKER_A)
    malformed = types_pb2.Fence(attempt_id="a1", claim_generation=3, scheduler_epoch=1)
    request = worker_pb2.RenewManyRequest(
        renewals=[
            worker_pb2.RenewRequest(fence=held, progress="p"),
            worker_pb2.RenewRequest(fence=malformed),
            worker_pb2.RenewRequest(fence=released),
            worker_pb2.RenewRequest(),
        ]
    )
    response = worker.RenewMany(request, metadata=WORKER_A)
    ok, bad, fenced, empty = response.results
    assert (ok.renewal.outcome, ok.renewal.ttl_seconds, ok.HasField("error")) == (
        types_pb2.OUTCOME_OK,
        30,
        False,
    )
    assert (bad.error.code, bad.HasField("renewal")) == ("INVALID_ARGUMENT", False)
    assert bad.error.message.startswith("renewals[1].fence.task_id")
    assert (fenced.renewal.outcome, fenced.renewal.reason) == (
        types_pb2.OUTCOME_FENCED,
        types_pb2.FENCE_REASON_RELEASED,
    )
    assert (empty.error.code, empty.error.message) == (
        "INVALID_ARGUMENT",
        "renewals[3].fence is required: send back the fence the claim returned",
    )
    # Another principal's claim: the error Renew would raise, in its own result.
    other = worker.RenewMany(
        worker_pb2.RenewManyRequest(renewals=[worker_pb2.RenewRequest(fence=held)]),
        metadata=(("x-coordinator-principal", "worker-b"),),
    )
    assert other.results[0].error.code == "PERMISSION_DENIED"
    assert "belongs to 'worker-a', not to 'worker-b'" in other.results[0].error.message
    before = keyspace()
    worker.RenewMany(
        worker_pb2.RenewManyRequest(renewals=[worker_pb2.RenewRequest(fence=malformed)]),
        metadata=WORKER_A,
    )
    assert keyspace() == before  # a bad item writes nothing


def test_more_than_a_thousand_items_are_refused_whole_and_renew_nothing(
    tasks: tasks_pb2_grpc.TaskServiceStub,
    worker: worker_pb2_grpc.WorkerServiceStub,
    keyspace: Probe,
) -> None:
    fence = _claim(tasks, worker, "t")
    request = worker_pb2.RenewManyRequest(
        renewals=[worker_pb2.RenewRequest(fence=fence, progress="moved")] * 1001
    )
    helpers.refused(
        worker.RenewMany,
        request,
        grpc.StatusCode.INVALID_ARGUMENT,
        "renewals: at most 1000 per call, got 1001",
        keyspace,
        metadata=WORKER_A,
    )


def test_a_checkpoint_too_large_is_that_items_error(
    tasks: tasks_pb2_grpc.TaskServiceStub, worker: worker_pb2_grpc.WorkerServiceStub
) -> None:
    fence = _claim(tasks, worker, "t")
    big = worker_pb2.RenewRequest(fence=fence, checkpoint=b"x" * (64 * 1024 + 1))
    [result] = worker.RenewMany(
        worker_pb2.RenewManyRequest(renewals=[big]), metadata=WORKER_A
    ).results
    assert result.error.code == "INVALID_ARGUMENT"
    assert result.error.message.startswith("renewals[0].checkpoint")
