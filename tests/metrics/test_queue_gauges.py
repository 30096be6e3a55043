"""The per-queue autoscaling gauges of two real ``coordinator serve`` replicas on one keyspace,
scraped over HTTP and read with GetStats while tasks are created, claimed, committed and
reclaimed (a claim left to expire) over gRPC: both replicas export the same figures, the ones
the keyspace holds."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from coordinator.domain.digests import digest_of
from coordinator.etcd_process import EtcdProcess
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
from tests.helpers import eventually
from tests.metrics.test_metrics_endpoint import Samples, Served, value

WORKER = (("x-coordinator-principal", "worker-a"),)
INPUT = b"queued input"

Counts = dict[str, tuple[int, int]]
"""queue -> (ready, claimed)."""


@pytest.fixture
def two(etcd: EtcdProcess, prefix: str, tmp_path: Path) -> Iterator[tuple[Served, Served]]:
    """Two serve processes on this test's keyspace, stopped (exit 0) afterwards."""
    first = Served(etcd, prefix, tmp_path / "serve-1.log")
    try:
        second = Served(etcd, prefix, tmp_path / "serve-2.log")
        try:
            yield first, second
        finally:
            second.stop()
    finally:
        first.stop()


def _scraped(samples: Samples) -> Counts:
    """(ready, claimed) per queue, from one scrape; every queue has all three gauges."""
    queues = {
        dict(labels)["queue"] for name, labels in samples if name == "coordinator_queue_ready_tasks"
    }
    for queue in queues:
        assert ("coordinator_queue_oldest_ready_age_seconds", frozenset({("queue", queue)})) in (
            samples
        )
        assert ("coordinator_queue_claimed_tasks", frozenset({("queue", queue)})) in samples
    assert value(samples, "coordinator_queues_left_out") == 0
    return {
        q: (
            int(value(samples, "coordinator_queue_ready_tasks", queue=q)),
            int(value(samples, "coordinator_queue_claimed_tasks", queue=q)),
        )
        for q in queues
    }


def _stats(admin: admin_pb2_grpc.AdminServiceStub) -> Counts:
    response = admin.GetStats(admin_pb2.GetStatsRequest())
    assert response.queues_left_out == 0
    return {q.queue: (q.ready_tasks, q.claimed_tasks) for q in response.queues}


def _both_report(replicas: tuple[Served, Served], expected: Counts) -> None:
    def check() -> bool:
        for served in replicas:
            assert _scraped(served.scrape()) == expected
            with grpc.insecure_channel(served.target, options=GRPC_OPTIONS) as channel:
                assert _stats(admin_pb2_grpc.AdminServiceStub(channel)) == expected
        return True

    eventually(check, message=f"the replicas did not both report {expected}")


def test_two_replicas_export_the_same_queue_gauges(two: tuple[Served, Served]) -> None:
    first, second = two
    with (
        grpc.insecure_channel(first.target, options=GRPC_OPTIONS) as one,
        grpc.insecure_channel(second.target, options=GRPC_OPTIONS) as other,
    ):
        tasks = tasks_pb2_grpc.TaskServiceStub(one)
        worker = worker_pb2_grpc.WorkerServiceStub(other)
        epoch = admin_pb2_grpc.AdminServiceStub(one).GetEpoch(admin_pb2.GetEpochRequest()).epoch
        created = time.monotonic()
        for task_id, queue in (("s1", "scale"), ("s2", "scale"), ("s3", "scale"), ("o1", "other")):
            tasks.CreateTask(tasks_pb2.CreateTaskRequest(task_id=task_id, queue=queue, input=INPUT))
        _both_report(two, {"scale": (3, 0), "other": (1, 0)})

        claimed = worker.ClaimNext(
            worker_pb2.ClaimNextRequest(queue="scale", scheduler_epoch=epoch, ttl_seconds=30),
            metadata=WORKER,
        )
        assert claimed.outcome == types_pb2.OUTCOME_CLAIMED
        _both_report(two, {"scale": (2, 1), "other": (1, 0)})
        # The age is measured on the server's clock: between 0 and the time since the creates.
        age = value(first.scrape(), "coordinator_queue_oldest_ready_age_seconds", queue="scale")
        assert 0 <= age <= time.monotonic() - created + 0.05

        committed = worker.Commit(
            worker_pb2.CommitRequest(
                fence=claimed.fence,
                input_digest=digest_of(INPUT),
                result_digest=digest_of(b"done"),
                result=b"done",
            ),
            metadata=WORKER,
        )
        assert committed.outcome == types_pb2.OUTCOME_COMMITTED
        _both_report(two, {"scale": (2, 0), "other": (1, 0)})

        # A claim left to expire: the reclaimer (on whichever replica gets there first) puts
        # the task back, and both replicas count it ready again, not claimed.
        left = worker.ClaimNext(
            worker_pb2.ClaimNextRequest(queue="other", scheduler_epoch=epoch, ttl_seconds=3),
            metadata=WORKER,
        )
        assert (left.outcome, left.fence.task_id) == (types_pb2.OUTCOME_CLAIMED, "o1")
        _both_report(two, {"scale": (2, 0), "other": (0, 1)})
        _both_report(two, {"scale": (2, 0), "other": (1, 0)})
        reclaimed = tasks.GetTask(tasks_pb2.GetTaskRequest(task_id="o1"))
        assert reclaimed.task.state == types_pb2.TASK_STATE_READY
        assert [a.end for a in reclaimed.attempts] == [types_pb2.ATTEMPT_END_EXPIRED]
