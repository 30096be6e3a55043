"""The same behaviour from the sync SDK and the asyncio SDK (coordinator.sdk.aio).

Every test runs twice, once per SDK (tests/sdk/both.py), against a real coordinator on the
session etcd: claim and commit; a paused holder (a frozen process, and a claim never renewed)
whose late commit is FENCED/SUPERSEDED while a takeover commits; a loss reported once; the
epoch followed by itself; OutcomeUnknown against TransportError from a stopped coordinator;
an effect performed once, then SKIPPED by a second attempt; fail (with a delay, non-retryable,
fenced); an exception leaving the claim's block (a retryable failure) against a stop (a
release); a long poll; a checkpoint sent once.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from coordinator import lifeline
from coordinator.demo.outbox import OutboxProcess
from coordinator.domain.states import (
    AttemptEnd,
    DeadLetterReason,
    FenceReason,
    Outcome,
    TaskState,
)
from coordinator.errors import InvalidArgument
from coordinator.etcd_process import EtcdProcess, free_port
from coordinator.sdk import (
    CallRetry,
    ClaimRefused,
    EffectStatus,
    HttpDownstream,
    LossSource,
    LostReason,
    OutcomeUnknown,
    TaskRetryPolicy,
    TransportError,
    WorkerClient,
)
from coordinator.sdk._status import ATTEMPT_HINT, NO_COORDINATOR_HINT
from tests.helpers import eventually
from tests.sdk.both import Held, Sdk, Sent, Worker
from tests.sdk.replicas import replicas
from tests.sdk.support import QUEUE, Served, served_with_task

TTL = timedelta(seconds=1)  # etcd grants 2 s
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def coordinator(etcd: EtcdProcess, prefix: str) -> Iterator[Served]:
    """A coordinator on this test's prefix with one READY task "t1"."""
    with served_with_task(etcd.endpoint, prefix) as running:
        yield running


@pytest.fixture
def producer(coordinator: Served) -> Iterator[WorkerClient]:
    """A sync client for the producer's and the admin's calls."""
    with coordinator.client("producer") as client:
        yield client


def claimed(worker: Worker, **kwargs: Any) -> Held:
    """Claim t1 and insist that it worked."""
    claim = worker.claim("t1", ttl=kwargs.pop("ttl", TTL), **kwargs)
    assert not isinstance(claim, ClaimRefused), claim
    return claim


def take_over(worker: Worker) -> Held:
    """Claim t1 as soon as its holder's lease has run out."""

    def attempt() -> Held | None:
        claim = worker.claim("t1", ttl=timedelta(seconds=30))
        return None if isinstance(claim, ClaimRefused) else claim

    return eventually(attempt, timeout=15, message="t1 never became claimable")


def test_claim_renew_and_commit(sdk: Sdk, coordinator: Served, producer: WorkerClient) -> None:
    worker = sdk.client(coordinator.target, "worker-a")
    claim = worker.claim_next(QUEUE, ttl=TTL)
    assert not isinstance(claim, ClaimRefused), claim
    with claim:
        assert not claim.wait_lost(timedelta(seconds=3))  # past the 2 s lease
        assert claim.renewals >= 3  # at TTL/3
        outcome = claim.commit(b"done")
    assert (outcome.outcome, outcome.state) == (Outcome.COMMITTED, TaskState.DONE)
    assert claim.committed and not claim.is_lost()
    task = worker.get_task("t1")
    assert (task.state, task.result_commit_id) == (TaskState.DONE, outcome.result_commit_id)
    assert [a.end for a in task.attempts] == [AttemptEnd.COMMITTED]


def test_a_job_never_renewed_is_fenced_superseded_while_the_takeover_commits(
    sdk: Sdk, coordinator: Served
) -> None:
    worker, rescuer = sdk.client(coordinator.target, "a"), sdk.client(coordinator.target, "b")
    seen: list[LostReason] = []
    stale = claimed(worker, on_lost=seen.append)  # never entered: no keepalive
    with take_over(rescuer) as fresh:
        assert fresh.generation > stale.generation
        assert fresh.commit(b"fresh").committed
    late = stale.commit(b"stale")
    assert (late.outcome, late.reason) == (Outcome.FENCED, FenceReason.SUPERSEDED)
    assert [(r.outcome, r.reason, r.source) for r in seen] == [
        (Outcome.FENCED, FenceReason.SUPERSEDED, LossSource.COMMIT)
    ]
    task = rescuer.get_task("t1")
    assert [a.end for a in task.attempts] == [AttemptEnd.EXPIRED, AttemptEnd.COMMITTED]


@pytest.mark.slow
def test_a_frozen_worker_process_is_fenced_superseded_while_the_takeover_commits(
    sdk: Sdk, coordinator: Served, tmp_path: Path
) -> None:
    args = ["--sdk", sdk.kind, "--target", coordinator.target, "--task", "t1"]
    with (tmp_path / "worker.err").open("w") as err:
        sleeper = subprocess.Popen(
            [sys.executable, "-m", "tests.sdk.paused_worker", *args],
            cwd=ROOT,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=err,
            text=True,
        )
        lifeline.kill_with_parent(sleeper.pid)  # dies with this test run
    assert sleeper.stdin is not None and sleeper.stdout is not None
    try:
        holding = json.loads(sleeper.stdout.readline() or "{}")
        assert holding.get("op") == "holding", (tmp_path / "worker.err").read_text()
        os.kill(sleeper.pid, signal.SIGSTOP)  # frozen with its keepalive, past its TTL
        rescuer = sdk.client(coordinator.target, "rescuer")
        with take_over(rescuer) as claim:
            assert claim.generation > holding["generation"]
            assert claim.commit(b"rescued").committed
        os.kill(sleeper.pid, signal.SIGCONT)
        sleeper.stdin.write("commit now\n")
        sleeper.stdin.flush()
        late = json.loads(sleeper.stdout.readline() or "{}")
        assert sleeper.wait(timeout=30) == 0, (tmp_path / "worker.err").read_text()
    finally:
        if sleeper.poll() is None:
            os.kill(sleeper.pid, signal.SIGCONT)
            sleeper.kill()
            sleeper.wait(timeout=30)
    assert (late["outcome"], late["reason"]) == ("FENCED", "SUPERSEDED")
    # Reported once, by whichever call saw it first after the thaw: its renewal or its commit.
    assert len(late["losses"]) == 1, late
    assert late["losses"][0][:2] == ["FENCED", "SUPERSEDED"]
    task = rescuer.get_task("t1")
    assert task.state is TaskState.DONE
    assert task.result_commit_id == f"{task.attempts[-1].attempt_id}@{claim.generation}"


def test_a_cancel_is_reported_once(sdk: Sdk, coordinator: Served, producer: WorkerClient) -> None:
    worker = sdk.client(coordinator.target, "worker-a")
    seen: list[LostReason] = []
    with claimed(worker, on_lost=seen.append) as claim:
        producer.cancel_task("t1", reason="no longer needed")
        assert claim.wait_lost(timedelta(seconds=5))
        lost = claim.lost_reason
        assert lost is not None
        assert (lost.outcome, lost.source) == (Outcome.CANCELLED, LossSource.RENEW)
        assert claim.commit(b"late").outcome is Outcome.CANCELLED  # asked, refused, not reported
    assert seen == [lost]
    task = producer.get_task("t1")
    assert (task.state, task.result_commit_id) == (TaskState.CANCELLED, "")


def test_an_epoch_bump_fences_the_job_once_and_the_next_claim_follows_it(
    sdk: Sdk, coordinator: Served, producer: WorkerClient
) -> None:
    worker = sdk.client(coordinator.target, "worker-a")
    seen: list[LostReason] = []
    with claimed(worker, on_lost=seen.append) as claim:
        assert producer.admin.bump_epoch() == 2
        assert claim.wait_lost(timedelta(seconds=5))
        assert claim.release().outcome is Outcome.FENCED  # asked, refused, not reported again
    assert [(r.outcome, r.reason, r.source) for r in seen] == [
        (Outcome.FENCED, FenceReason.EPOCH_CHANGED, LossSource.RENEW)
    ]
    # The client still pins epoch 1; its claim is not refused EPOCH_CHANGED but re-pinned and
    # sent again: the task is held (by the fenced claim's lease) until it expires.
    refused = worker.claim("t1", ttl=TTL)
    assert isinstance(refused, ClaimRefused)
    assert refused.outcome is Outcome.ALREADY_CLAIMED
    with take_over(worker) as again:
        assert again.commit(b"done").committed


def test_a_paused_coordinator_leaves_an_unknown_outcome_a_dead_one_a_transport_error(
    sdk: Sdk, etcd: EtcdProcess, prefix: str, tmp_path: Path
) -> None:
    short = CallRetry(
        timeout=timedelta(seconds=0.5),
        budget=timedelta(seconds=1),
        initial_backoff=timedelta(milliseconds=50),
        max_backoff=timedelta(milliseconds=200),
    )
    with replicas(etcd, prefix, tmp_path, 1) as (replica,):
        worker = sdk.client(replica.target, "worker-a", retry=short)
        worker.create_task("t1", input=b"x", queue=QUEUE)
        claim = claimed(worker, ttl=timedelta(seconds=30))
        replica.pause()  # the connection stays up: the commit is sent, never answered
        with pytest.raises(OutcomeUnknown) as unknown:
            claim.commit(b"result")
        assert unknown.value.code == "DEADLINE_EXCEEDED"
        assert str(unknown.value).endswith(f"outcome unknown, not failed; {ATTEMPT_HINT}")
        assert not claim.committed and claim.lost_reason is None
        replica.resume()
        # The same call again learns the truth (a try may have landed: COMMITTED either way).
        assert eventually(lambda: _committed_or_none(claim), timeout=15).committed
        replica.kill()  # nothing listens: no try of a new client can reach a coordinator
        with pytest.raises(TransportError) as dead:
            sdk.client(replica.target, "worker-b", retry=short).get_task("t1")
    assert type(dead.value) is TransportError
    assert dead.value.code == "UNAVAILABLE"
    assert str(dead.value).endswith("no try reached a coordinator" + NO_COORDINATOR_HINT)


def _committed_or_none(claim: Held) -> Any:
    try:
        return claim.commit(b"result")
    except TransportError:  # a try inside the channel's reconnect back-off: not yet
        return None


def test_an_effect_is_performed_once_and_skipped_by_a_second_attempt(
    sdk: Sdk, coordinator: Served
) -> None:
    key = coordinator.effect_id("t1", "notify", "email")
    with OutboxProcess() as outbox:
        down = HttpDownstream(outbox.url)
        first, second = sdk.client(coordinator.target, "a"), sdk.client(coordinator.target, "b")
        with claimed(first, ttl=timedelta(seconds=30)) as claim:
            done = claim.effect("notify", "email", b"the report is ready", down)
            assert (done.status, done.effect_id, done.sent) == (EffectStatus.EXECUTED, key, True)
            assert claim.release("handing over").released
        with take_over(second) as again:
            skipped = again.effect("notify", "email", b"the report is ready", down)
            assert (skipped.status, skipped.sent, skipped.external_ref) == (
                EffectStatus.SKIPPED,
                False,
                done.external_ref,
            )
            assert again.commit(b"done").committed
        assert outbox.performed(key) == 1
        assert outbox.counts()["calls"] == {key: 1}


def test_a_free_port_is_a_transport_error_before_any_coordinator_exists(sdk: Sdk) -> None:
    once = CallRetry(attempts=2, initial_backoff=timedelta(milliseconds=10))
    worker = sdk.client(f"127.0.0.1:{free_port()}", "nobody", retry=once)
    with pytest.raises(TransportError) as raised:
        worker.epoch()
    assert type(raised.value) is TransportError
    assert str(raised.value).endswith("no try reached a coordinator" + NO_COORDINATOR_HINT)


NO_BACKOFF = TaskRetryPolicy(initial_backoff=timedelta(0))
"""A retry policy under which only a fail's own delay keeps a task waiting."""


def test_a_fail_with_a_delay_keeps_the_task_out_of_ready_until_then(
    sdk: Sdk, coordinator: Served
) -> None:
    worker = sdk.client(coordinator.target, "worker-a")
    worker.create_task("t2", input=b"x", queue="later", retry_policy=NO_BACKOFF)
    first = worker.claim_next("later", ttl=timedelta(seconds=30))
    assert not isinstance(first, ClaimRefused), first
    before = datetime.now(UTC)
    with first:
        failed = first.fail("Flaky", retryable=True, delay=timedelta(seconds=2))
    assert (failed.outcome, failed.state) == (Outcome.OK, TaskState.DELAYED)
    assert failed.next_eligible_at is not None
    assert failed.next_eligible_at >= before + timedelta(seconds=2)
    assert not first.is_lost()
    refused = worker.claim_next("later", ttl=TTL)
    assert isinstance(refused, ClaimRefused) and refused.outcome is Outcome.NO_READY_TASK
    task = worker.get_task("t2")
    assert (task.state, task.next_eligible_at) == (TaskState.DELAYED, failed.next_eligible_at)

    def claimable() -> Held | None:
        claim = worker.claim_next("later", ttl=timedelta(seconds=30))
        return None if isinstance(claim, ClaimRefused) else claim

    with eventually(claimable, timeout=15, message="t2 never became claimable") as again:
        assert again.commit(b"done").committed
    attempts = worker.get_task("t2").attempts
    assert [a.end for a in attempts] == [AttemptEnd.FAILED, AttemptEnd.COMMITTED]
    assert attempts[1].started_at is not None
    assert attempts[1].started_at >= failed.next_eligible_at


def test_a_non_retryable_fail_dead_letters_and_a_superseded_one_is_fenced_once(
    sdk: Sdk, coordinator: Served
) -> None:
    worker, rescuer = sdk.client(coordinator.target, "a"), sdk.client(coordinator.target, "b")
    seen: list[LostReason] = []
    stale = claimed(worker, on_lost=seen.append)  # never entered: no keepalive
    with take_over(rescuer) as fresh:
        failed = fresh.fail("BadInput", retryable=False)
    assert (failed.outcome, failed.state) == (Outcome.OK, TaskState.FAILED)
    assert not fresh.is_lost()
    late = stale.fail(ValueError("too late"))
    assert (late.outcome, late.reason) == (Outcome.FENCED, FenceReason.SUPERSEDED)
    assert [(r.outcome, r.reason, r.source) for r in seen] == [
        (Outcome.FENCED, FenceReason.SUPERSEDED, LossSource.FAIL)
    ]
    task = rescuer.get_task("t1")
    assert (task.state, task.dead_letter_reason) == (
        TaskState.FAILED,
        DeadLetterReason.NON_RETRYABLE,
    )
    assert [(a.end, a.error_code) for a in task.attempts] == [
        (AttemptEnd.EXPIRED, ""),
        (AttemptEnd.FAILED, "BadInput"),
    ]


def test_an_exception_leaving_the_block_is_a_retryable_failure(
    sdk: Sdk, coordinator: Served
) -> None:
    worker = sdk.client(coordinator.target, "worker-a")
    with pytest.raises(ValueError, match="boom"), claimed(worker, ttl=timedelta(seconds=30)):
        raise ValueError("boom")
    task = worker.get_task("t1")
    assert [(a.end, a.error_code, a.error_message) for a in task.attempts] == [
        (AttemptEnd.FAILED, "ValueError", "boom")
    ]
    assert task.state in (TaskState.READY, TaskState.DELAYED)  # another attempt, by its backoff
    assert task.last_error == "ValueError: boom"


@pytest.mark.parametrize("stop", [KeyboardInterrupt, SystemExit, asyncio.CancelledError])
def test_a_stop_leaving_the_block_gives_the_task_back_uncounted(
    sdk: Sdk, coordinator: Served, stop: type[BaseException]
) -> None:
    worker = sdk.client(coordinator.target, "worker-a")
    with pytest.raises(stop), claimed(worker, ttl=timedelta(seconds=30)):
        raise stop("stopping")
    task = worker.get_task("t1")
    assert [(a.end, a.error_code, a.error_message) for a in task.attempts] == [
        (AttemptEnd.FAILED, "WorkerShutdown", f"{stop.__name__}: stopping")
    ]
    assert (task.state, task.attempts_counted, task.last_error) == (TaskState.READY, 0, "")


def test_a_long_poll_waits_for_a_task_and_its_lease_starts_at_the_answer(
    sdk: Sdk, coordinator: Served, producer: WorkerClient
) -> None:
    # A try's deadline shorter than the wait: the poll must get its wait on top of it.
    short = CallRetry(attempts=1, timeout=timedelta(seconds=0.5))
    worker = sdk.client(coordinator.target, "worker-a", retry=short)
    empty = worker.claim_next("idle", ttl=TTL, wait=timedelta(seconds=1.5))
    assert isinstance(empty, ClaimRefused) and empty.outcome is Outcome.NO_READY_TASK
    assert "had no ready task for 1.5 s" in empty.message
    with ThreadPoolExecutor(max_workers=1) as background:
        polling = background.submit(
            worker.claim_next, "polled", ttl=timedelta(seconds=30), wait=timedelta(seconds=15)
        )
        eventually(lambda: coordinator.store.long_poll.waiting() == 1)
        created_at = time.monotonic()  # the request left before this: the poll is waiting
        producer.create_task("t2", input=b"x", queue="polled")
        claim = polling.result(timeout=30)
    assert not isinstance(claim, ClaimRefused), claim
    left, now = claim.remaining(), time.monotonic()
    # The lease clock started at the answer, after the create: at most the time since the
    # create has run off the lease, not the time the poll waited before it.
    assert left > claim.ttl - timedelta(seconds=now - created_at)
    with claim:
        assert claim.commit(b"done").committed


def test_a_checkpoint_the_server_kept_is_not_sent_again(sdk: Sdk, coordinator: Served) -> None:
    sent = Sent()
    worker = sdk.client(coordinator.target, "worker-a", sent=sent)
    with claimed(worker) as claim:
        claim.checkpoint(b"step-1")

        def carried() -> list[bool] | None:
            marks = [r.HasField("checkpoint") for r in sent.renewals()]
            # The renewal that carried it, and two more after its answer.
            return marks if True in marks and len(marks) - marks.index(True) >= 3 else None

        marks = eventually(carried, timeout=15, message="no renewals after the checkpoint")
        assert not claim.is_lost()
        assert claim.commit(b"done").committed
    assert marks.count(True) == 1
    assert [r.checkpoint for r in sent.renewals() if r.HasField("checkpoint")] == [b"step-1"]
    task = worker.get_task("t1")
    assert (task.checkpoint_size, [a.checkpoint_size for a in task.attempts]) == (6, [6])


def test_one_keepalive_loop_renews_a_clients_claims_together_in_renew_many(
    sdk: Sdk, coordinator: Served
) -> None:
    sent = Sent()
    worker = sdk.client(coordinator.target, "worker-a", sent=sent)
    for n in (2, 3):
        worker.create_task(f"t{n}", input=b"x", queue=QUEUE)
    with claimed(worker) as one, claimed_next(worker) as two, claimed_next(worker) as three:
        held = (one, two, three)
        eventually(lambda: min(c.renewals for c in held) >= 2, timeout=15)
        assert not [c for c in held if c.is_lost()]
    assert sent.of("Renew") == []  # never one call per claim
    batches = sent.of("RenewMany")
    assert sum(len(b.renewals) for b in batches) >= 6
    assert max(len(b.renewals) for b in batches) >= 2  # claims due together share a call


def claimed_next(worker: Worker) -> Held:
    """Claim the next task of QUEUE and insist that it worked."""
    claim = worker.claim_next(QUEUE, ttl=TTL)
    assert not isinstance(claim, ClaimRefused), claim
    return claim


def test_a_result_or_input_past_the_limit_is_refused_before_it_is_sent(
    sdk: Sdk, coordinator: Served
) -> None:
    sent = Sent()
    worker = sdk.client(coordinator.target, "worker-a", sent=sent)
    big = 20 * 1024 * 1024  # past gRPC's message limit too: RESOURCE_EXHAUSTED, retried, before
    with claimed(worker) as claim:
        with pytest.raises(InvalidArgument, match=f"result is {big} bytes, the limit is 524288"):
            claim.commit(b"x" * big)
        assert not claim.is_lost()
        assert claim.commit(b"done").committed
    with pytest.raises(InvalidArgument, match="input is 262145 bytes, the limit is 262144"):
        worker.create_task("t-big", input=b"x" * (256 * 1024 + 1), queue=QUEUE)
    assert [len(r.result) for r in sent.of("Commit")] == [4]
    assert sent.of("CreateTask") == []
