"""The space guard seen from a worker and a producer (real etcd with a 1 MiB quota, real
server): above high water only growth is refused, typed, while the pool drains; at NOSPACE
every write is refused typed, never INTERNAL, and renewals that write nothing go on."""

from __future__ import annotations

from typing import Any

import grpc
import pytest

from coordinator.domain.digests import digest_of
from coordinator.domain.keys import Keyspace
from coordinator.domain.space import SpaceState
from coordinator.metrics import Metrics
from coordinator.server.identity import ANONYMOUS
from coordinator.store import EtcdKV
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
from tests.helpers import Probe, refused
from tests.space.conftest import QUOTA, fill

INPUT = b"the task input"
RESULT = b'{"summary": "drained"}'
WORKER = (("x-coordinator-principal", "worker-a"),)
EXHAUSTED = grpc.StatusCode.RESOURCE_EXHAUSTED


def _create(tasks: tasks_pb2_grpc.TaskServiceStub, task_id: str) -> tasks_pb2.CreateTaskRequest:
    return tasks_pb2.CreateTaskRequest(task_id=task_id, input=INPUT, input_digest=digest_of(INPUT))


def _claim(
    worker: worker_pb2_grpc.WorkerServiceStub, admin: admin_pb2_grpc.AdminServiceStub, task: str
) -> types_pb2.Fence:
    epoch = admin.GetEpoch(admin_pb2.GetEpochRequest()).epoch
    claim = worker.Claim(
        worker_pb2.ClaimRequest(task_id=task, scheduler_epoch=epoch, ttl_seconds=30),
        metadata=WORKER,
    )
    assert claim.outcome == types_pb2.OUTCOME_CLAIMED, claim.message
    return claim.fence


def _commit(worker: worker_pb2_grpc.WorkerServiceStub, fence: types_pb2.Fence) -> Any:
    request = worker_pb2.CommitRequest(
        fence=fence, input_digest=digest_of(INPUT), result_digest=digest_of(RESULT), result=RESULT
    )
    return worker.Commit(request, metadata=WORKER)


def _guard(kv: EtcdKV, metrics: Metrics, high_water: float) -> SpaceState:
    DbSizeWatch(
        kv, quota_bytes=QUOTA, warn_ratio=0.8, high_water=high_water, metrics=metrics
    ).check()
    return kv.space.state


def test_above_high_water_growth_is_refused_and_the_pool_drains(
    kv: EtcdKV,
    tasks: tasks_pb2_grpc.TaskServiceStub,
    worker: worker_pb2_grpc.WorkerServiceStub,
    admin: admin_pb2_grpc.AdminServiceStub,
    probe: Probe,
    metrics: Metrics,
    prefix: str,
) -> None:
    tasks.CreateTask(_create(tasks, "t-1"))
    tasks.CreateTask(_create(tasks, "t-2"))
    tasks.CreateTask(_create(tasks, "t-9"))
    fence = _claim(worker, admin, "t-1")
    assert _guard(kv, metrics, high_water=0.001) is SpaceState.HIGH_WATER  # any db is above

    # A keyed call that drains runs and is answered; its answer is growth, so it is not kept.
    keyed_cancel = (("idempotency-key", "cancel-t-9"),)
    cancel = tasks_pb2.CancelTaskRequest(task_id="t-9")
    assert (
        tasks.CancelTask(cancel, metadata=keyed_cancel).task.state == types_pb2.TASK_STATE_CANCELLED
    )
    assert kv.get(Keyspace(prefix).idem(ANONYMOUS, "cancel-t-9")) is None

    refused(tasks.CreateTask, _create(tasks, "t-3"), EXHAUSTED, "high-water mark", probe)
    keyed = (("idempotency-key", "create-t-3"),)  # the key is not stored either
    refused(
        tasks.CreateTask, _create(tasks, "t-3"), EXHAUSTED, "retry after", probe, metadata=keyed
    )
    new_input = tasks_pb2.UpdateInputRequest(task_id="t-2", input=b"v2")
    refused(tasks.UpdateInput, new_input, EXHAUSTED, "space guard", probe)
    stage = worker_pb2.StageResultRequest(
        fence=fence, result_digest=digest_of(RESULT), result=RESULT
    )
    refused(worker.StageResult, stage, EXHAUSTED, "space guard", probe, metadata=WORKER)
    # A new checkpoint is not kept, but the claim is renewed: a filling etcd costs no claim.
    before = probe()
    checkpoint = worker_pb2.RenewRequest(fence=fence, checkpoint=b"step 3 of 9")
    kept = worker.Renew(checkpoint, metadata=WORKER)
    assert kept.outcome == types_pb2.OUTCOME_OK and kept.ttl_seconds > 0, kept.message
    assert "space guard" in kept.checkpoint_refused and "retry after" in kept.checkpoint_refused
    assert probe() == before
    plain = worker_pb2.RenewRequest(fence=fence)
    batch = worker.RenewMany(worker_pb2.RenewManyRequest(renewals=[plain]), metadata=WORKER)
    assert batch.results[0].renewal.outcome == types_pb2.OUTCOME_OK
    assert not batch.results[0].renewal.checkpoint_refused

    # The pool drains: commit, claim the next task and commit it.
    assert _commit(worker, fence).outcome == types_pb2.OUTCOME_COMMITTED
    assert _commit(worker, _claim(worker, admin, "t-2")).outcome == types_pb2.OUTCOME_COMMITTED
    refusals = metrics.registry.get_sample_value(
        "coordinator_space_refusals_total", {"state": "high_water"}
    )
    assert refusals == 6
    assert metrics.registry.get_sample_value("coordinator_space_guard_state") == 1

    assert _guard(kv, metrics, high_water=1.0) is SpaceState.CLEAR
    assert tasks.CreateTask(_create(tasks, "t-3")).task.task_id == "t-3"


def test_at_nospace_every_write_is_refused_typed_and_renewals_go_on(
    raw: Any,
    kv: EtcdKV,
    tasks: tasks_pb2_grpc.TaskServiceStub,
    worker: worker_pb2_grpc.WorkerServiceStub,
    admin: admin_pb2_grpc.AdminServiceStub,
    probe: Probe,
    metrics: Metrics,
    prefix: str,
) -> None:
    tasks.CreateTask(_create(tasks, "t-1"))
    tasks.CreateTask(_create(tasks, "t-2"))
    fence = _claim(worker, admin, "t-1")
    fill(raw)  # etcd raises its NOSPACE alarm; no reading yet: etcd's own refusal trips the guard

    refused(tasks.CreateTask, _create(tasks, "t-3"), EXHAUSTED, "NOSPACE", probe)
    assert kv.space.state is SpaceState.NOSPACE
    assert _guard(kv, metrics, high_water=0.8) is SpaceState.NOSPACE
    epoch = admin.GetEpoch(admin_pb2.GetEpochRequest()).epoch
    claim = worker_pb2.ClaimRequest(task_id="t-2", scheduler_epoch=epoch, ttl_seconds=30)
    refused(worker.Claim, claim, EXHAUSTED, "NOSPACE", probe, metadata=WORKER)
    with pytest.raises(grpc.RpcError) as info:
        _commit(worker, fence)
    assert info.value.code() == EXHAUSTED and "NOSPACE" in str(info.value.details())

    # A renewal that writes nothing keeps the claim: its txn only compares.
    renewed = worker.Renew(worker_pb2.RenewRequest(fence=fence), metadata=WORKER)
    assert renewed.outcome == types_pb2.OUTCOME_OK, renewed.message
    got = tasks.GetTask(tasks_pb2.GetTaskRequest(task_id="t-1"))
    assert got.task.state == types_pb2.TASK_STATE_CLAIMED
