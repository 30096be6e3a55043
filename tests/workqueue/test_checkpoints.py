"""Checkpoints: kept with the attempt by a fenced renewal (only when changed), handed to the next
attempt of the same task revision by its claim."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any

import grpc
import pytest

from coordinator.etcd_process import EtcdProcess
from coordinator.sdk import Claim
from coordinator.server import PRINCIPAL_METADATA_KEY
from coordinator.store import Store
from coordinator.v1 import tasks_pb2, tasks_pb2_grpc, types_pb2, worker_pb2, worker_pb2_grpc
from tests.helpers import eventually
from tests.sdk.support import QUEUE, served

A = ((PRINCIPAL_METADATA_KEY, "worker-a"),)
B = ((PRINCIPAL_METADATA_KEY, "worker-b"),)
Probe = Callable[[], tuple[int, int]]


def _renew(
    worker: worker_pb2_grpc.WorkerServiceStub, fence: types_pb2.Fence, checkpoint: bytes
) -> worker_pb2.RenewResponse:
    request = worker_pb2.RenewRequest(fence=fence, progress="p", checkpoint=checkpoint)
    return worker.Renew(request, metadata=A)


def test_a_takeover_receives_the_previous_attempts_checkpoint(
    store: Store,
    etcd_client: Any,
    worker: worker_pb2_grpc.WorkerServiceStub,
    tasks: tasks_pb2_grpc.TaskServiceStub,
    claimed: worker_pb2.ClaimResponse,
) -> None:
    assert claimed.checkpoint == b""  # the first attempt starts afresh
    attempt_key = store.ctx.keys.attempt("t-1", claimed.fence.attempt_id)
    assert _renew(worker, claimed.fence, b"step-3").outcome == types_pb2.OUTCOME_OK
    _, written = etcd_client.get(attempt_key)
    assert _renew(worker, claimed.fence, b"step-3").outcome == types_pb2.OUTCOME_OK
    _, again = etcd_client.get(attempt_key)
    assert again.mod_revision == written.mod_revision  # unchanged: not written again

    store.ctx.kv.revoke(store.tasks.get("t-1").lease_id)  # the holder's lease expires
    request = worker_pb2.ClaimRequest(task_id="t-1", scheduler_epoch=1, ttl_seconds=30)
    taken = eventually(
        lambda: (
            r
            if (r := worker.Claim(request, metadata=B)).outcome == types_pb2.OUTCOME_CLAIMED
            else None
        )
    )
    assert taken.checkpoint == b"step-3"
    # A third attempt still finds it though the second never checkpointed.
    worker.Release(worker_pb2.ReleaseRequest(fence=taken.fence), metadata=B)
    third = worker.Claim(request, metadata=A)
    assert (third.outcome, third.checkpoint) == (types_pb2.OUTCOME_CLAIMED, b"step-3")
    # A new input is new work: no checkpoint of the old one is handed over.
    tasks.UpdateInput(tasks_pb2.UpdateInputRequest(task_id="t-1", input=b"new input"))
    fresh = worker.Claim(request, metadata=B)
    assert (fresh.outcome, fresh.checkpoint) == (types_pb2.OUTCOME_CLAIMED, b"")


def test_a_checkpoint_too_large_is_refused_and_writes_nothing(
    worker: worker_pb2_grpc.WorkerServiceStub, claimed: worker_pb2.ClaimResponse, keyspace: Probe
) -> None:
    before = keyspace()
    with pytest.raises(grpc.RpcError) as refused:
        _renew(worker, claimed.fence, b"x" * (64 * 1024 + 1))
    assert refused.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert "checkpoint is 65537 bytes, the limit is 65536" in (refused.value.details() or "")
    assert keyspace() == before


def test_a_fenced_renewal_keeps_no_checkpoint(
    store: Store,
    worker: worker_pb2_grpc.WorkerServiceStub,
    claimed: worker_pb2.ClaimResponse,
    keyspace: Probe,
) -> None:
    store.admin.bump_epoch()
    before = keyspace()
    assert _renew(worker, claimed.fence, b"late").outcome == types_pb2.OUTCOME_FENCED
    assert keyspace() == before


def test_the_sdk_sends_the_latest_checkpoint_and_the_next_job_resumes_from_it(
    etcd: EtcdProcess, prefix: str
) -> None:
    with served(etcd.endpoint, prefix) as running, running.client("w1") as client:
        client.create_task("t1", input=b"in", queue=QUEUE)
        claim = client.claim("t1", ttl=timedelta(seconds=3))
        assert isinstance(claim, Claim) and claim.previous_checkpoint == b""
        with claim:
            claim.checkpoint(b"rows 0-99 done")
            claim.checkpoint(b"rows 0-199 done")  # only the latest is sent
            eventually(lambda: claim.renewals >= 1, message="no renewal was accepted")
            claim.release("rebalancing")
        task = client.get_task("t1")
        assert task.checkpoint_size == len(b"rows 0-199 done")
        assert [a.checkpoint_size for a in task.attempts] == [15]
        again = client.claim("t1", ttl=timedelta(seconds=3))
        assert isinstance(again, Claim)
        assert again.previous_checkpoint == b"rows 0-199 done"
        again.release("done with the test")
        assert [a.checkpoint_size for a in client.get_task("t1").attempts] == [15, 15]
        assert [t.checkpoint_size for t in client.list_tasks()] == [None]  # reads no attempt
        client.update_input("t1", input=b"new")  # new work: nothing to resume from
        assert client.get_task("t1").checkpoint_size == 0
