"""Per-principal write budgets over a real server and etcd: a caller past its budget is refused
typed (its growth calls) or keeps its claim without the checkpoint (its renewals), while other
principals write on."""

from __future__ import annotations

from collections.abc import Iterator

import grpc
import pytest
from prometheus_client import CollectorRegistry

from coordinator.domain.digests import digest_of
from coordinator.domain.roles import Role
from coordinator.domain.write_budget import BudgetPolicy
from coordinator.server import build_server
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
from tests.conftest import GRPC_OPTIONS
from tests.helpers import Probe, refused

# 1 byte/s over 10,000 s: a 10,000-byte budget that refills nothing a test would notice.
BUDGETS = {
    Role.WORKER: BudgetPolicy(rate=1.0, window=10_000.0),
    Role.PM: BudgetPolicy(rate=1.0, window=10_000.0),
}
PM_A = (("x-coordinator-principal", "pm-a"), ("x-coordinator-roles", "pm"))
PM_B = (("x-coordinator-principal", "pm-b"), ("x-coordinator-roles", "pm"))
WORKER = (("x-coordinator-principal", "worker-a"), ("x-coordinator-roles", "worker"))
EXHAUSTED = grpc.StatusCode.RESOURCE_EXHAUSTED


@pytest.fixture
def channel(store: Store) -> Iterator[grpc.Channel]:
    """A channel to a server with the test's write budgets."""
    srv, port = build_server(
        store, listen="127.0.0.1:0", max_workers=8, health_interval=0.2, write_budgets=BUDGETS
    )
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}", options=GRPC_OPTIONS) as chan:
            yield chan
    finally:
        srv.stop(grace=None).wait()


def _create(task_id: str, size: int) -> tasks_pb2.CreateTaskRequest:
    data = task_id.encode().ljust(size, b".")
    return tasks_pb2.CreateTaskRequest(task_id=task_id, input=data, input_digest=digest_of(data))


def test_a_producer_past_its_budget_is_refused_and_another_is_not(
    tasks: tasks_pb2_grpc.TaskServiceStub, keyspace: Probe, store: Store
) -> None:
    tasks.CreateTask(_create("a-1", 6000), metadata=PM_A)
    refused(
        tasks.CreateTask, _create("a-2", 6000), EXHAUSTED, "retry after", keyspace, metadata=PM_A
    )
    refused(
        tasks.CreateTask,
        _create("a-3", 6000),
        EXHAUSTED,
        "write budget of 'pm-a' (1 bytes/s over 10000 s, write_budget_pm) is spent",
        keyspace,
        metadata=PM_A,
    )
    tasks.CreateTask(_create("b-1", 6000), metadata=PM_B)  # a budget is per principal
    registry: CollectorRegistry = store.ctx.metrics.registry
    refusals = registry.get_sample_value(
        "coordinator_write_budget_refusals_total", {"what": "input"}
    )
    assert refusals == 2


def test_a_worker_past_its_budget_keeps_its_claim_without_the_checkpoint(
    tasks: tasks_pb2_grpc.TaskServiceStub,
    worker: worker_pb2_grpc.WorkerServiceStub,
    admin: admin_pb2_grpc.AdminServiceStub,
    keyspace: Probe,
) -> None:
    tasks.CreateTask(_create("t-1", 10), metadata=PM_A)
    epoch = admin.GetEpoch(admin_pb2.GetEpochRequest()).epoch
    claim = worker.Claim(
        worker_pb2.ClaimRequest(task_id="t-1", scheduler_epoch=epoch, ttl_seconds=30),
        metadata=WORKER,
    )
    fence = claim.fence
    result = b"r" * 6000
    stage = worker_pb2.StageResultRequest(
        fence=fence, result_digest=digest_of(result), result=result
    )
    assert worker.StageResult(stage, metadata=WORKER).outcome == types_pb2.OUTCOME_OK
    refused(worker.StageResult, stage, EXHAUSTED, "write_budget_worker", keyspace, metadata=WORKER)

    before = keyspace()
    checkpoint = worker_pb2.RenewRequest(fence=fence, checkpoint=b"c" * 6000)
    many = worker.RenewMany(worker_pb2.RenewManyRequest(renewals=[checkpoint]), metadata=WORKER)
    [answer] = many.results
    assert answer.renewal.outcome == types_pb2.OUTCOME_OK and answer.renewal.ttl_seconds > 0
    assert "write budget of 'worker-a'" in answer.renewal.checkpoint_refused
    assert keyspace() == before  # the checkpoint was not written
    huge = worker_pb2.StageResultRequest(
        fence=fence, result_digest=digest_of(b"h" * 20_000), result=b"h" * 20_000
    )
    refused(
        worker.StageResult, huge, EXHAUSTED, "more than a whole window", keyspace, metadata=WORKER
    )


def test_a_replay_of_a_keyed_create_is_answered_not_charged_again(
    tasks: tasks_pb2_grpc.TaskServiceStub,
) -> None:
    keyed = (*PM_A, ("idempotency-key", "create-k-1"))
    first = tasks.CreateTask(_create("k-1", 9000), metadata=keyed)
    again = tasks.CreateTask(_create("k-1", 9000), metadata=keyed)  # 1,000 bytes left: a replay
    assert again.task.task_id == first.task.task_id == "k-1"
    assert again == first
