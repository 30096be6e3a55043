"""One worker token churning the largest checkpoints and staged results it can, against an etcd
with a 1 MiB quota, while a producer and a worker of another principal run a normal pool (the
issue's first row, scaled to seconds): etcd never reaches NOSPACE, the abuser gets typed
refusals only, and every legitimate create, claim and commit answers."""

from __future__ import annotations

from collections.abc import Iterator

import grpc
import pytest

from coordinator.domain.digests import digest_of
from coordinator.domain.space import SpaceState
from coordinator.metrics import Metrics
from coordinator.store import EtcdKV, Store
from coordinator.store.etcd.db_size import DbSizeWatch
from coordinator.v1 import (
    admin_pb2,
    admin_pb2_grpc,
    tasks_pb2,
    tasks_pb2_grpc,
    types_pb2,
    worker_pb2,
    worker_pb2_grpc,
)
from tests.space.conftest import QUOTA, budgeted_channel

ABUSER = (("x-coordinator-principal", "abuser"), ("x-coordinator-roles", "worker"))
WORKER = (("x-coordinator-principal", "worker-a"), ("x-coordinator-roles", "worker"))
PM = (("x-coordinator-principal", "pm-a"), ("x-coordinator-roles", "pm"))
ROUNDS = 30
BIG = 60_000  # a churned checkpoint or staged result: 30 rounds of both are 3.6 MB


@pytest.fixture
def channel(store: Store) -> Iterator[grpc.Channel]:
    """A channel to a server with write budgets, over the 1 MiB-quota etcd."""
    with budgeted_channel(store) as chan:
        yield chan


def _claim(
    worker: worker_pb2_grpc.WorkerServiceStub,
    epoch: int,
    task_id: str,
    who: tuple[tuple[str, str], ...],
) -> types_pb2.Fence:
    request = worker_pb2.ClaimRequest(task_id=task_id, scheduler_epoch=epoch, ttl_seconds=30)
    claim = worker.Claim(request, metadata=who)
    assert claim.outcome == types_pb2.OUTCOME_CLAIMED, claim.message
    return claim.fence


def _create(tasks: tasks_pb2_grpc.TaskServiceStub, task_id: str) -> None:
    data = task_id.encode()
    request = tasks_pb2.CreateTaskRequest(task_id=task_id, input=data, input_digest=digest_of(data))
    tasks.CreateTask(request, metadata=PM)


def test_one_token_churning_writes_never_fills_etcd_and_the_pool_runs(
    kv: EtcdKV,
    tasks: tasks_pb2_grpc.TaskServiceStub,
    worker: worker_pb2_grpc.WorkerServiceStub,
    admin: admin_pb2_grpc.AdminServiceStub,
    metrics: Metrics,
) -> None:
    watch = DbSizeWatch(kv, quota_bytes=QUOTA, warn_ratio=0.8, high_water=0.8, metrics=metrics)
    epoch = admin.GetEpoch(admin_pb2.GetEpochRequest()).epoch
    _create(tasks, "abused")
    fence = _claim(worker, epoch, "abused", ABUSER)
    not_kept = refused = 0
    for i in range(ROUNDS):
        churn = worker_pb2.RenewRequest(fence=fence, checkpoint=bytes([i]) * BIG)
        many = worker.RenewMany(worker_pb2.RenewManyRequest(renewals=[churn]), metadata=ABUSER)
        assert many.results[0].renewal.outcome == types_pb2.OUTCOME_OK  # the claim is kept
        not_kept += "write budget" in many.results[0].renewal.checkpoint_refused
        result = bytes([i]) * BIG
        stage = worker_pb2.StageResultRequest(
            fence=fence, result_digest=digest_of(result), result=result
        )
        try:
            worker.StageResult(stage, metadata=ABUSER)
        except grpc.RpcError as exc:
            assert exc.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, exc.details()
            refused += 1
        _create(tasks, f"legit-{i}")  # the pool: create, claim, commit
        legit = _claim(worker, epoch, f"legit-{i}", WORKER)
        commit = worker_pb2.CommitRequest(
            fence=legit,
            input_digest=digest_of(f"legit-{i}".encode()),
            result_digest=digest_of(b"ok"),
            result=b"ok",
        )
        assert worker.Commit(commit, metadata=WORKER).outcome == types_pb2.OUTCOME_COMMITTED
        watch.check()
        assert kv.space.state is SpaceState.CLEAR
    # The first checkpoint fits the budget (60 of 100 KB); every later write does not.
    assert (not_kept, refused) == (ROUNDS - 1, ROUNDS)
    assert kv.db_size() < 0.8 * QUOTA
