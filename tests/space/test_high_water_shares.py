"""Above the high-water mark, growth is refused only to the callers who used their share (real
etcd with a 1 MiB quota, a real server with write budgets): a producer of small tasks goes on,
keyed creates too, while the token that churned big writes is refused typed; above the full
mark nobody's growth goes; claims and commits go on throughout."""

from __future__ import annotations

from collections.abc import Iterator

import grpc
import pytest

from coordinator.config import Config
from coordinator.domain.digests import digest_of
from coordinator.domain.space import SpaceState
from coordinator.errors import ConfigError
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
from tests.helpers import Probe, refused
from tests.space.conftest import QUOTA, budgeted_channel

SHARE = 0.1  # of a producer's 1,000,000 bytes a window: 100,000 bytes above the mark
ABUSER = (("x-coordinator-principal", "abuser"), ("x-coordinator-roles", "pm,worker"))
PRODUCER = (("x-coordinator-principal", "pm-a"), ("x-coordinator-roles", "pm"))
WORKER = (("x-coordinator-principal", "worker-a"), ("x-coordinator-roles", "worker"))
ADMIN = (("x-coordinator-principal", "op"), ("x-coordinator-roles", "admin"))
EXHAUSTED = grpc.StatusCode.RESOURCE_EXHAUSTED


@pytest.fixture
def channel(store: Store) -> Iterator[grpc.Channel]:
    """A channel to a server with write budgets and high-water shares of 1/10."""
    with budgeted_channel(store, high_water_share=SHARE) as chan:
        yield chan


def _create(task_id: str, data: bytes) -> tasks_pb2.CreateTaskRequest:
    return tasks_pb2.CreateTaskRequest(task_id=task_id, input=data, input_digest=digest_of(data))


def _read(kv: EtcdKV, metrics: Metrics, *, high_water: float, full: float) -> SpaceState:
    watch = DbSizeWatch(
        kv, quota_bytes=QUOTA, warn_ratio=0.8, high_water=high_water, full=full, metrics=metrics
    )
    watch.check()
    return kv.space.state


def _claim_and_commit(
    worker: worker_pb2_grpc.WorkerServiceStub, epoch: int, task_id: str, data: bytes
) -> None:
    request = worker_pb2.ClaimRequest(task_id=task_id, scheduler_epoch=epoch, ttl_seconds=30)
    claim = worker.Claim(request, metadata=WORKER)
    assert claim.outcome == types_pb2.OUTCOME_CLAIMED, claim.message
    commit = worker_pb2.CommitRequest(
        fence=claim.fence,
        input_digest=digest_of(data),
        result_digest=digest_of(b"ok"),
        result=b"ok",
    )
    assert worker.Commit(commit, metadata=WORKER).outcome == types_pb2.OUTCOME_COMMITTED


def test_above_high_water_only_the_callers_past_their_share_are_refused(
    kv: EtcdKV,
    tasks: tasks_pb2_grpc.TaskServiceStub,
    worker: worker_pb2_grpc.WorkerServiceStub,
    admin: admin_pb2_grpc.AdminServiceStub,
    probe: Probe,
    metrics: Metrics,
) -> None:
    epoch = admin.GetEpoch(admin_pb2.GetEpochRequest()).epoch
    tasks.CreateTask(_create("held", b"held"), metadata=ABUSER)
    request = worker_pb2.ClaimRequest(task_id="held", scheduler_epoch=epoch, ttl_seconds=30)
    fence = worker.Claim(request, metadata=ABUSER).fence
    assert _read(kv, metrics, high_water=0.001, full=1.0) is SpaceState.HIGH_WATER

    # The abuser spends its share (100,000 bytes) on one checkpoint, then is refused typed.
    big = worker_pb2.RenewRequest(fence=fence, checkpoint=b"c" * 60_000)
    assert not worker.Renew(big, metadata=ABUSER).checkpoint_refused
    bigger = worker_pb2.RenewRequest(fence=fence, checkpoint=b"d" * 60_000)
    again = worker.Renew(bigger, metadata=ABUSER)
    assert again.outcome == types_pb2.OUTCOME_OK  # the claim is renewed, the checkpoint not kept
    assert "high-water share" in again.checkpoint_refused
    refused(tasks.CreateTask, _create("a-2", b"x" * 50_000), EXHAUSTED, "high-water share", probe,
            metadata=ABUSER)  # fmt: skip
    stage = worker_pb2.StageResultRequest(
        fence=fence, result_digest=digest_of(b"r" * 50_000), result=b"r" * 50_000
    )
    refused(worker.StageResult, stage, EXHAUSTED, "high-water share", probe, metadata=ABUSER)
    # An admin has no budget, so no share: refused as every caller was before shares.
    refused(tasks.CreateTask, _create("op-1", b"op"), EXHAUSTED, "without a budget", probe,
            metadata=ADMIN)  # fmt: skip

    # The producer of small tasks goes on: plain and keyed creates, and the pool drains them.
    for i in range(20):
        data = f"small task {i}".encode()
        keyed = (*PRODUCER, ("idempotency-key", f"create-p-{i}"))
        created = tasks.CreateTask(_create(f"p-{i}", data), metadata=keyed if i % 2 else PRODUCER)
        assert created.task.task_id == f"p-{i}"
        _claim_and_commit(worker, epoch, f"p-{i}", data)
    refusals = metrics.registry.get_sample_value(
        "coordinator_space_refusals_total", {"state": "high_water"}
    )
    assert refusals == 4  # the checkpoint, the create, the staging, the admin's create

    # Above the full mark the producer's share counts for nothing; claims and commits go on.
    assert _read(kv, metrics, high_water=0.001, full=0.002) is SpaceState.FULL
    refused(tasks.CreateTask, _create("p-full", b"small"), EXHAUSTED, "full mark", probe,
            metadata=PRODUCER)  # fmt: skip
    assert metrics.registry.get_sample_value("coordinator_space_guard_state") == 1
    assert (
        metrics.registry.get_sample_value("coordinator_space_refusals_total", {"state": "full"})
        == 1
    )


def test_claims_and_commits_go_on_above_the_full_mark(
    kv: EtcdKV,
    tasks: tasks_pb2_grpc.TaskServiceStub,
    worker: worker_pb2_grpc.WorkerServiceStub,
    admin: admin_pb2_grpc.AdminServiceStub,
    metrics: Metrics,
) -> None:
    epoch = admin.GetEpoch(admin_pb2.GetEpochRequest()).epoch
    tasks.CreateTask(_create("t-1", b"t-1"), metadata=PRODUCER)
    assert _read(kv, metrics, high_water=0.001, full=0.001) is SpaceState.FULL
    _claim_and_commit(worker, epoch, "t-1", b"t-1")


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"etcd_quota_full": 0.7}, "etcd_quota_full (0.7) must be at least etcd_quota_high_water"),
        ({"etcd_quota_full": 1.5}, "etcd_quota_full must be in (0, 1]"),
        ({"write_budget_high_water_share": 2.0}, "write_budget_high_water_share must be in [0, 1]"),
    ],
)
def test_a_bad_space_setting_stops_the_server_naming_it(
    settings: dict[str, float], message: str
) -> None:
    with pytest.raises(ConfigError) as raised:
        Config(**settings)  # type: ignore[arg-type]
    assert message in str(raised.value)
