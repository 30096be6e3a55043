"""A worker follows a new scheduler epoch by itself on its next claim; what it already holds
stays fenced. Through a real server and etcd."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta

import pytest

from coordinator.domain.states import FenceReason, Outcome, TaskState
from coordinator.etcd_process import EtcdProcess
from coordinator.sdk import Claim, ClaimRefused, WorkerClient
from tests.sdk.support import QUEUE, CallCounter, Served, served

TTL = timedelta(seconds=30)


@pytest.fixture
def coordinator(etcd: EtcdProcess, prefix: str) -> Iterator[Served]:
    """A coordinator on this test's prefix with two READY tasks, t1 and t2."""
    with served(etcd.endpoint, prefix) as running, running.client("pm") as pm:
        pm.create_task("t1", input=b"one", queue=QUEUE)
        pm.create_task("t2", input=b"two", queue=QUEUE)
        yield running


def _claim(client: WorkerClient, how: str, task_id: str) -> Claim | ClaimRefused:
    """Claim ``task_id`` (``claim``) or whichever task is ready (``claim_next``)."""
    if how == "claim":
        return client.claim(task_id, ttl=TTL)
    return client.claim_next(QUEUE, ttl=TTL)


@pytest.mark.parametrize("how", ["claim", "claim_next"])
def test_the_next_claim_follows_a_bumped_epoch_and_a_held_job_stays_fenced(
    coordinator: Served, how: str
) -> None:
    calls = CallCounter()
    with (
        coordinator.client("worker-a", interceptors=[calls]) as worker,
        coordinator.client("admin") as admin,
    ):
        held = _claim(worker, how, "t1")
        assert isinstance(held, Claim), held
        assert held.fence.scheduler_epoch == 1
        assert admin.admin.bump_epoch() == 2  # AdminService.BumpEpoch: leases are not revoked
        before = dict(calls.calls)

        other_id = ({"t1", "t2"} - {held.task_id}).pop()
        second = _claim(worker, how, other_id)

        # Refused under epoch 1, re-pinned with one GetEpoch, claimed under epoch 2: the caller
        # did nothing.
        assert isinstance(second, Claim), second
        assert (second.task_id, second.fence.scheduler_epoch) == (other_id, 2)
        method = "Claim" if how == "claim" else "ClaimNext"
        assert calls.calls[method] - before[method] == 2
        assert calls.calls["GetEpoch"] - before["GetEpoch"] == 1
        # The claim held across the bump is never re-pinned: its commit is fenced.
        late = held.commit(b"late")
        assert (late.outcome, late.reason) == (Outcome.FENCED, FenceReason.EPOCH_CHANGED)
        assert second.commit(b"done").committed
        fenced, done = admin.get_task(held.task_id), admin.get_task(other_id)
    assert (fenced.state, fenced.result_commit_id) == (TaskState.CLAIMED, "")
    assert done.state is TaskState.DONE


def test_a_refusal_for_another_reason_is_not_retried(coordinator: Served) -> None:
    calls = CallCounter()
    with (
        coordinator.client("worker-a", interceptors=[calls]) as worker,
        coordinator.client("worker-b") as other,
    ):
        assert isinstance(other.claim("t1", ttl=TTL), Claim)
        refused = worker.claim("t1", ttl=TTL)
    assert isinstance(refused, ClaimRefused)
    assert refused.outcome is Outcome.ALREADY_CLAIMED
    assert (calls.calls["Claim"], calls.calls["GetEpoch"]) == (1, 1)  # the first pin only
