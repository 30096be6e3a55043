"""A claim whose answer is lost costs no attempt, in both SDKs.

Every Claim / ClaimNext the SDK sends carries an idempotency key of its own, and each transport
retry of that call sends the same one, so the server answers a retry whose first try landed
with that try's attempt instead of starting another. The answers are lost by a client
interceptor after the server ran the call (tests/sdk/both.py ``LostAnswers``), against a real
coordinator on the session etcd.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from datetime import timedelta

import pytest

from coordinator.domain.idempotency import idempotency_key
from coordinator.domain.states import AttemptEnd, TaskState
from coordinator.etcd_process import EtcdProcess
from coordinator.sdk import CallRetry, ClaimRefused, TaskRetryPolicy, WorkerClient
from coordinator.sdk._core.requests import lease_clock_start
from tests.sdk.both import LostAnswers, Sdk
from tests.sdk.support import Served, served

TTL = timedelta(seconds=30)
QUEUE = "lost"
# Retries come quickly, and enough of them to outlast every lost answer.
FAST = CallRetry(
    attempts=10, initial_backoff=timedelta(milliseconds=20), max_backoff=timedelta(seconds=0.1)
)


@pytest.fixture
def coordinator(etcd: EtcdProcess, prefix: str) -> Iterator[Served]:
    """A coordinator on this test's prefix."""
    with served(etcd.endpoint, prefix) as running:
        yield running


@pytest.fixture
def producer(coordinator: Served) -> Iterator[WorkerClient]:
    """A sync client for the producer's calls."""
    with coordinator.client("producer") as client:
        yield client


def test_a_task_of_two_attempts_survives_three_lost_claim_answers_and_runs(
    sdk: Sdk, coordinator: Served, producer: WorkerClient
) -> None:
    twice = TaskRetryPolicy(max_attempts=2)
    producer.create_task("once", input=b"x", queue=QUEUE, retry_policy=twice)
    lost = LostAnswers("ClaimNext", 3)
    worker = sdk.client(coordinator.target, "w", retry=FAST, lost=lost)
    claim = worker.claim_next(QUEUE, ttl=TTL)
    assert not isinstance(claim, ClaimRefused), claim
    # Four tries of one call, one key: the fourth got the first one's answer, replayed.
    assert len(lost.keys) == 4 and len(set(lost.keys)) == 1
    assert idempotency_key(lost.keys[0]) == lost.keys[0]  # well-formed, and short
    assert len(lost.keys[0]) == 16
    with claim:
        assert claim.commit(b"done").committed
    task = producer.get_task("once")
    assert (task.state, task.attempt) == (TaskState.DONE, 1)
    assert [a.end for a in task.attempts] == [AttemptEnd.COMMITTED]
    # The next call is another call: a key of its own.
    assert isinstance(worker.claim_next(QUEUE, ttl=TTL), ClaimRefused)
    assert len(lost.keys) == 5 and lost.keys[4] != lost.keys[0]


def test_a_lost_claim_by_id_is_replayed_and_not_refused_as_already_claimed(
    sdk: Sdk, coordinator: Served, producer: WorkerClient
) -> None:
    producer.create_task("t1", input=b"x", queue=QUEUE)
    lost = LostAnswers("Claim", 1)
    worker = sdk.client(coordinator.target, "w", retry=FAST, lost=lost)
    claim = worker.claim("t1", ttl=TTL)
    assert not isinstance(claim, ClaimRefused), claim  # not ALREADY_CLAIMED by itself
    assert len(lost.keys) == 2 and len(set(lost.keys)) == 1
    with claim:
        assert claim.commit(b"done").committed
    assert producer.get_task("t1").attempt == 1


def test_a_long_polls_lost_answer_is_replayed_with_its_lease_clock_from_the_first_send(
    sdk: Sdk, coordinator: Served, producer: WorkerClient
) -> None:
    lost = LostAnswers("ClaimNext", 1)
    worker = sdk.client(coordinator.target, "w", retry=FAST, lost=lost)
    # The task arrives while the poll waits: it is won on the server, and the answer lost.
    later = threading.Timer(0.5, lambda: producer.create_task("late", input=b"x", queue=QUEUE))
    later.start()
    try:
        claim = worker.claim_next(QUEUE, ttl=TTL, wait=timedelta(seconds=10))
    finally:
        later.join()
    assert not isinstance(claim, ClaimRefused), claim
    assert len(lost.keys) == 2 and len(set(lost.keys)) == 1
    # The replayed grant may be as old as the first send: the lease clock starts there, so
    # the half second the poll waited before the task existed is off the lease.
    assert claim.remaining() < TTL - timedelta(seconds=0.5)
    with claim:
        assert claim.commit(b"done").committed
    task = producer.get_task("late")
    assert (task.state, task.attempt) == (TaskState.DONE, 1)


def test_a_claim_sent_again_under_a_new_epoch_is_a_new_call_with_a_new_key(
    sdk: Sdk, coordinator: Served, producer: WorkerClient
) -> None:
    producer.create_task("t1", input=b"x", queue=QUEUE)
    keys = LostAnswers("Claim", 0)  # loses nothing: records the keys
    worker = sdk.client(coordinator.target, "w", retry=FAST, lost=keys)
    assert worker.epoch() == 1
    producer.admin.bump_epoch()
    claim = worker.claim("t1", ttl=TTL)  # refused EPOCH_CHANGED, re-pinned, sent again
    assert not isinstance(claim, ClaimRefused), claim
    # The same key on a changed request would be refused (ALREADY_EXISTS): a key of its own.
    assert len(keys.keys) == 2 and keys.keys[0] != keys.keys[1]
    with claim:
        assert claim.commit(b"done").committed


def test_the_lease_clock_of_a_long_poll_answered_on_a_retry_starts_at_the_first_send() -> None:
    # A plain claim: from the send, however many tries.
    assert lease_clock_start(10.0, 12.0, None) == 10.0
    assert lease_clock_start(10.0, 12.0, None, tries=3) == 10.0
    # A long poll answered by its only try: at the answer (its grant came with the answer).
    assert lease_clock_start(10.0, 12.0, 20.0) == 12.0
    # Answered by a retry: the grant may be an earlier try's, made any time after the send.
    assert lease_clock_start(10.0, 12.0, 20.0, tries=2) == 10.0
