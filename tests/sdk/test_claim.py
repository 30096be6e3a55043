"""Claim: keepalive, loss detection and the acceptance points, through a real server and etcd."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any, cast

import grpc
import pytest
from google.protobuf.duration_pb2 import Duration
from google.protobuf.timestamp_pb2 import Timestamp

from coordinator.domain.digests import digest_of
from coordinator.domain.states import AttemptEnd, FenceReason, Outcome, TaskState
from coordinator.errors import InvalidArgument
from coordinator.etcd_process import EtcdProcess
from coordinator.fence_wire import fence_to_proto
from coordinator.sdk import (
    PRINCIPAL_METADATA,
    Claim,
    ClaimLost,
    ClaimRefused,
    LossSource,
    LostReason,
    WorkerClient,
)
from coordinator.v1 import types_pb2, worker_pb2, worker_pb2_grpc
from tests.conftest import GRPC_OPTIONS
from tests.helpers import eventually
from tests.sdk.support import QUEUE, CallCounter, Served, served

TTL = timedelta(seconds=1)  # etcd grants 2 s


@pytest.fixture
def coordinator(etcd: EtcdProcess, prefix: str) -> Iterator[Served]:
    """A coordinator on this test's prefix."""
    with served(etcd.endpoint, prefix) as running:
        yield running


@pytest.fixture
def calls() -> CallCounter:
    """Counts the worker's calls as they go on the wire."""
    return CallCounter()


@pytest.fixture
def worker(coordinator: Served, calls: CallCounter) -> Iterator[WorkerClient]:
    """The worker under test, with one READY task "t1" in queue "q"."""
    with coordinator.client("worker-a", interceptors=[calls]) as client:
        client.create_task("t1", input=b"input", queue=QUEUE)
        yield client


@pytest.fixture
def other(coordinator: Served) -> Iterator[WorkerClient]:
    """A second principal: producer, admin or competing worker."""
    with coordinator.client("worker-b") as client:
        yield client


def claim_t1(client: WorkerClient, **kwargs: Any) -> Claim:
    """Claim t1 and insist that it worked."""
    claim = client.claim("t1", ttl=TTL, **kwargs)
    assert isinstance(claim, Claim), claim
    return claim


def claim_when_free(client: WorkerClient) -> Claim:
    """Claim t1 as soon as its current claim is gone (expired)."""

    def attempt() -> Claim | None:
        claim = client.claim("t1", ttl=TTL)
        return claim if isinstance(claim, Claim) else None

    claim = eventually(attempt, timeout=10, message="t1 never became claimable")
    assert claim is not None
    return claim


def test_keepalive_holds_a_short_lease_past_three_ttls(
    worker: WorkerClient, other: WorkerClient
) -> None:
    with claim_t1(worker) as claim:
        assert not claim.wait_lost(claim.ttl * 3.5)
        assert claim.renewals >= 6  # every TTL/3
        refused = other.claim("t1", ttl=TTL)
        assert isinstance(refused, ClaimRefused)
        assert refused.outcome is Outcome.ALREADY_CLAIMED
        assert claim.commit(b"done").committed


def test_progress_markers_coalesce_to_the_latest(
    worker: WorkerClient, etcd_client: Any, prefix: str
) -> None:
    with claim_t1(worker) as claim:
        for step in range(5):
            claim.progress(f"step-{step}")

        def stored_progress() -> str:
            value, _ = etcd_client.get(f"{prefix}/claims/t1")
            return str(json.loads(value)["progress"])

        # The server keeps a marker at least 5 s (PROGRESS_WRITE_INTERVAL) before the next.
        eventually(lambda: stored_progress() == "step-4", timeout=20)
        claim.commit(b"done")


def test_cancel_makes_the_job_lost_once(
    worker: WorkerClient, other: WorkerClient, calls: CallCounter
) -> None:
    seen: list[LostReason] = []
    with claim_t1(worker, on_lost=seen.append) as claim:
        other.cancel_task("t1", reason="no longer needed")
        assert claim.wait_lost(timedelta(seconds=5))
        lost = claim.lost_reason
        assert lost is not None
        assert (lost.outcome, lost.source) == (Outcome.CANCELLED, LossSource.RENEW)
        with pytest.raises(ClaimLost) as raised:
            claim.check()
        assert raised.value.reason == lost
        # The commit still reaches the server, which refuses it; no second callback.
        assert claim.commit(b"late").outcome is Outcome.CANCELLED
        assert calls.calls["Commit"] == 1
    assert seen == [lost]
    task = other.get_task("t1")
    assert task.state is TaskState.CANCELLED  # exit did not try to release a lost claim
    assert task.result_commit_id == ""


def test_epoch_bump_fences_the_job(worker: WorkerClient, other: WorkerClient) -> None:
    seen: list[LostReason] = []
    with claim_t1(worker, on_lost=seen.append) as claim:
        other.admin.bump_epoch()
        assert claim.wait_lost(timedelta(seconds=5))
    # The flag is set before the callback runs (on the keepalive's thread): wait for it.
    eventually(lambda: seen, message="on_lost was not called")
    assert [(r.outcome, r.reason) for r in seen] == [(Outcome.FENCED, FenceReason.EPOCH_CHANGED)]
    # The next claim follows the new epoch by itself (sdk/client.py), but a fenced claim's
    # lease is not revoked: the task is claimable again only once it expires.
    refused = worker.claim("t1", ttl=TTL)
    assert isinstance(refused, ClaimRefused)
    assert refused.outcome is Outcome.ALREADY_CLAIMED
    with claim_when_free(worker) as claim:
        assert claim.commit(b"done").committed


def test_commit_is_canonical_and_stops_the_keepalive(
    worker: WorkerClient, other: WorkerClient
) -> None:
    seen: list[LostReason] = []
    with claim_t1(worker, on_lost=seen.append) as claim:
        outcome = claim.commit(b"result")
        assert outcome.committed
        assert outcome.state is TaskState.DONE
        assert outcome.result_commit_id == f"{claim.fence.attempt_id}@{claim.generation}"
        # A repeated commit (a lost response) is COMMITTED again, not a conflict.
        assert claim.commit(b"result").result_commit_id == outcome.result_commit_id
        renewals = claim.renewals
        assert not claim.wait_lost(claim.ttl)  # the store answers renewals FENCED now: none sent
        assert claim.renewals == renewals
    assert seen == []
    task = other.get_task("t1")
    assert (task.state, task.result_commit_id) == (TaskState.DONE, outcome.result_commit_id)


def test_the_lease_end_moves_with_renewals_and_the_claim_deadline_stays(
    worker: WorkerClient,
) -> None:
    with claim_t1(worker) as claim:
        lease, deadline = claim.lease_expires_at, claim.claim_deadline
        assert lease is not None and deadline is not None and lease.tzinfo is UTC
        # LIMITS: a 2 s lease, a claim deadline 600 s after the claim.
        assert timedelta(seconds=590) < deadline - lease < timedelta(seconds=600)
        eventually(lambda: claim.renewals >= 1, timeout=5)
        renewed = claim.lease_expires_at
        assert renewed is not None and renewed > lease
        assert claim.claim_deadline == deadline
        assert claim.commit(b"done").committed


def test_wire_times_read_as_utc_datetimes() -> None:
    ends = worker_pb2.ClaimResponse(
        ttl_seconds=30,
        lease_expires_at=Timestamp(seconds=1_700_000_000, nanos=250_000_000),
        claim_deadline=Timestamp(seconds=1_700_003_600),
    )
    claim = Claim(cast(Any, None), ends, sent_at=0.0)  # no call is made
    assert claim.lease_expires_at == datetime(2023, 11, 14, 22, 13, 20, 250_000, tzinfo=UTC)
    assert claim.claim_deadline == datetime(2023, 11, 14, 23, 13, 20, tzinfo=UTC)
    unset = Claim(cast(Any, None), worker_pb2.ClaimResponse(ttl_seconds=30), sent_at=0.0)
    assert (unset.lease_expires_at, unset.claim_deadline) == (None, None)


def test_a_reused_lease_counts_down_from_what_the_server_says_is_left() -> None:
    # A claim on a young reused lease: TTL 30 s granted, 21 s left (never the 30 s).
    reused = worker_pb2.ClaimResponse(ttl_seconds=30, lease_remaining=Duration(seconds=21))
    claim = Claim(cast(Any, None), reused, sent_at=100.0, clock=lambda: 100.0)
    assert claim.remaining() == timedelta(seconds=21)
    # An older server sends no lease_remaining: the TTL, as before.
    old = Claim(
        cast(Any, None),
        worker_pb2.ClaimResponse(ttl_seconds=30),
        sent_at=100.0,
        clock=lambda: 100.0,
    )
    assert old.remaining() == timedelta(seconds=30)


def test_superseded_commit_is_fenced(worker: WorkerClient, other: WorkerClient) -> None:
    stale = claim_t1(worker)  # never entered: no keepalive, the lease runs out
    assert stale.remaining() <= stale.ttl
    with claim_when_free(other) as fresh:
        assert fresh.generation > stale.generation
        assert fresh.commit(b"fresh").committed
    outcome = stale.commit(b"stale")
    assert (outcome.outcome, outcome.reason) == (Outcome.FENCED, FenceReason.SUPERSEDED)
    assert stale.is_lost()
    assert stale.lost_reason is not None and stale.lost_reason.source is LossSource.COMMIT
    attempts = other.get_task("t1").attempts
    assert [a.end for a in attempts] == [AttemptEnd.EXPIRED, AttemptEnd.COMMITTED]


def test_remaining_counts_down_and_check_guards_the_margin(worker: WorkerClient) -> None:
    claim = claim_t1(worker)
    first = claim.remaining()
    assert timedelta(0) < first <= claim.ttl
    eventually(lambda: claim.remaining() < first - timedelta(milliseconds=300), timeout=3)
    claim.check(margin=timedelta(0))
    with pytest.raises(ClaimLost) as raised:
        claim.check(margin=claim.ttl)
    assert raised.value.reason is None  # not lost: only too little time left
    eventually(lambda: claim.remaining() == timedelta(0), timeout=5)
    claim.release("done with the test")


def test_lease_running_out_while_the_server_is_gone_loses_the_job(
    coordinator: Served, worker: WorkerClient
) -> None:
    with claim_t1(worker) as claim:
        coordinator.server.stop(0)
        assert claim.wait_lost(claim.ttl * 3)
        lost = claim.lost_reason
        assert lost is not None
        assert (lost.outcome, lost.reason) == (Outcome.FENCED, FenceReason.LEASE_EXPIRED)
        assert lost.source is LossSource.LOCAL_EXPIRY
        assert claim.remaining() == timedelta(0)


def test_an_exception_leaving_the_context_reports_a_retryable_failure(
    worker: WorkerClient, other: WorkerClient
) -> None:
    with pytest.raises(RuntimeError), claim_t1(worker) as claim:
        raise RuntimeError("the work failed")
    assert not claim.is_lost()
    task = other.get_task("t1")
    assert task.state is TaskState.READY
    [attempt] = task.attempts
    assert (attempt.end, attempt.error_code, attempt.error_message) == (
        AttemptEnd.FAILED,
        "RuntimeError",
        "the work failed",
    )
    with claim_t1(other) as again:
        assert again.generation > claim.generation
        assert again.release("giving it back").released


def test_leaving_the_context_without_an_exception_releases(
    worker: WorkerClient, other: WorkerClient
) -> None:
    with claim_t1(worker):
        pass
    task = other.get_task("t1")
    assert (task.state, [a.end for a in task.attempts]) == (TaskState.READY, [AttemptEnd.RELEASED])


def test_fail_not_retryable_dead_letters_and_ends_the_job(
    worker: WorkerClient, other: WorkerClient
) -> None:
    with claim_t1(worker) as claim:
        answer = claim.fail("BadInput", retryable=False, message="the input is not JSON")
    assert (answer.recorded, answer.state) == (True, TaskState.FAILED)
    assert not claim.is_lost()
    assert other.get_task("t1").state is TaskState.FAILED
    # The keepalive stopped with the claim: a renewal after its own Fail is not a loss.
    assert claim.fail("Again").reason is FenceReason.FAILED
    assert not claim.is_lost()


def test_authorize_and_stage(worker: WorkerClient, other: WorkerClient) -> None:
    with claim_t1(worker) as claim:
        assert claim.authorize_tool("email", "send")
        staged = claim.stage(b"draft")
        assert (staged.outcome, staged.current) == (Outcome.OK, True)
        other.cancel_task("t1")
        answer = claim.authorize_tool("email", "send")
        assert not answer
        assert answer.outcome is Outcome.CANCELLED
        assert claim.is_lost()


def test_claim_refusals_are_typed(worker: WorkerClient) -> None:
    empty = worker.claim_next("empty-queue", ttl=TTL)
    assert isinstance(empty, ClaimRefused)
    assert empty.outcome is Outcome.NO_READY_TASK
    task = worker.get_task("t1")
    stale = worker.claim("t1", ttl=TTL, expected_state_version=task.state_version + 100)
    assert isinstance(stale, ClaimRefused)
    assert stale.outcome is Outcome.STALE_STATE_VERSION
    assert stale.state_version == task.state_version
    with worker.claim_next(QUEUE, ttl=TTL) as claim:  # type: ignore[union-attr]
        assert (claim.task_id, claim.input) == ("t1", b"input")
        claim.commit(b"done")


def test_a_renewal_that_meets_its_own_commit_is_not_a_loss(
    coordinator: Served, worker: WorkerClient
) -> None:
    seen: list[LostReason] = []
    with claim_t1(worker, on_lost=seen.append) as claim:
        # The same attempt commits over another channel, as if this commit's answer were
        # still on its way when the next renewal is answered FENCED/ALREADY_COMMITTED.
        with grpc.insecure_channel(coordinator.target, options=GRPC_OPTIONS) as channel:
            response = worker_pb2_grpc.WorkerServiceStub(channel).Commit(
                worker_pb2.CommitRequest(
                    fence=fence_to_proto(claim.fence),
                    input_digest=claim.input_digest,
                    result_digest=digest_of(b"done"),
                    result=b"done",
                ),
                metadata=((PRINCIPAL_METADATA, "worker-a"),),
                timeout=5,
            )
        assert response.outcome == types_pb2.OUTCOME_COMMITTED
        renewals = claim.renewals
        assert not claim.wait_lost(claim.ttl)  # the keepalive stopped quietly
        assert claim.renewals == renewals
        assert claim.commit(b"done").committed
    assert seen == []


def test_a_sentence_as_error_code_is_refused_before_any_call(
    worker: WorkerClient, other: WorkerClient
) -> None:
    with claim_t1(worker) as claim:
        with pytest.raises(InvalidArgument, match="a name, not a sentence"):
            claim.fail("the input is empty", retryable=False)
        assert not claim.is_lost()  # nothing was sent: the claim is still held
        assert claim.fail("EmptyInput", retryable=False, message="the input is empty").recorded
    assert other.get_task("t1").state is TaskState.FAILED
