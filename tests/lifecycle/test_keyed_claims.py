"""A keyed ClaimNext writes its key in its own claim txns (store/claims/claim_keys.py).

Through a real gRPC channel on the session etcd: what the key costs (one more key in the claim's
revision, nothing else), what a retry gets (the same claims while alive, NO_READY_TASK once they
ended), a duplicate racing the first try (one claim, the same answer), and the refusals.
"""

from __future__ import annotations

import threading
from typing import Any

import grpc
import pytest

from coordinator.domain.digests import digest_of
from coordinator.domain.idempotency import KeyedClaims
from coordinator.domain.records import decode, encode
from coordinator.domain.states import Outcome, TaskState
from coordinator.store import Store
from coordinator.store.claims.claim_keys import ClaimKey, KeyTaken
from coordinator.v1 import tasks_pb2, tasks_pb2_grpc, types_pb2, worker_pb2, worker_pb2_grpc
from tests.lifecycle.support import create, snapshot, who
from tests.store.support import writes_between

CLAIM_NEXT = "/coordinator.v1.WorkerService/ClaimNext"


def _create(tasks: tasks_pb2_grpc.TaskServiceStub, task_id: str, queue: str = "q") -> None:
    request = tasks_pb2.CreateTaskRequest(task_id=task_id, queue=queue, input=b"in")
    tasks.CreateTask(request, metadata=who("pm-1"))


def _poll(queue: str = "q", *, wait: int = 0, max_tasks: int = 1) -> Any:
    return worker_pb2.ClaimNextRequest(
        queue=queue, scheduler_epoch=1, ttl_seconds=30, wait_seconds=wait, max_tasks=max_tasks
    )


def _commit_then_next(held: Any) -> Any:
    """A Commit of the claim ``held`` answered, claiming the next task of queue q."""
    return worker_pb2.CommitRequest(
        fence=held.fence,
        input_digest=held.input_digest,
        result_digest=digest_of(b"done"),
        result=b"done",
        next=worker_pb2.ClaimNextRequest(queue="q", scheduler_epoch=1, ttl_seconds=30),
    )


def _writes_after(store: Store, etcd_client: Any, start: int) -> dict[int, list[str]]:
    """Every key written under the store's prefix after revision ``start`` up to now, by
    revision (a delete as ``-kind``; the kind is the key's first segment under the prefix)."""
    prefix = store.ctx.keys.prefix + "/"
    sentinel = prefix + "zz-sentinel"
    now = etcd_client.put(sentinel, b"").header.revision  # after every write so far
    by_revision: dict[int, list[str]] = {}
    for event in writes_between(store, start + 1, now):
        if event.key != sentinel:
            kind = event.key.removeprefix(prefix).split("/", 1)[0]
            by_revision.setdefault(event.mod_revision, []).append(
                ("-" if event.deleted else "") + kind
            )
    return {rev: sorted(kinds) for rev, kinds in by_revision.items()}


def test_a_keyed_claim_next_writes_its_key_in_the_claim_txn_and_nothing_else(
    tasks: tasks_pb2_grpc.TaskServiceStub,
    worker: worker_pb2_grpc.WorkerServiceStub,
    store: Store,
    etcd_client: Any,
) -> None:
    _create(tasks, "t")
    start = etcd_client.get(store.ctx.keys.task("t"))[1].mod_revision
    won = worker.ClaimNext(_poll(), metadata=who("w1", key="k1"))
    assert won.outcome == types_pb2.OUTCOME_CLAIMED
    # One revision: the claim's five keys and the key's record (no reservation before it, no
    # stored answer after it).
    assert _writes_after(store, etcd_client, start) == {
        won.fence.claim_generation: sorted(
            ["tasks", "-ready", "claimed", "claims", "events", "keyed-claims"]
        )
    }
    kv = store.ctx.kv.get(store.ctx.keys.keyed_claims("w1", "k1"))
    assert kv is not None and kv.mod_revision == won.fence.claim_generation
    record = decode(KeyedClaims, kv.value)
    assert (record.method, record.task_ids, record.attempt_ids) == (
        CLAIM_NEXT,
        ("t",),
        (won.fence.attempt_id,),
    )


def test_a_keyed_poll_that_wins_nothing_writes_nothing(
    worker: worker_pb2_grpc.WorkerServiceStub, store: Store, etcd_client: Any
) -> None:
    before = snapshot(store, etcd_client)
    empty = worker.ClaimNext(_poll(), metadata=who("w1", key="k-empty"))
    assert empty.outcome == types_pb2.OUTCOME_NO_READY_TASK
    assert snapshot(store, etcd_client) == before
    assert store.ctx.kv.get(store.ctx.keys.keyed_claims("w1", "k-empty")) is None


def test_a_retry_gets_the_claims_still_alive_and_runs_again_once_none_is(
    tasks: tasks_pb2_grpc.TaskServiceStub,
    worker: worker_pb2_grpc.WorkerServiceStub,
    store: Store,
    etcd_client: Any,
) -> None:
    for name in ("a", "b"):
        _create(tasks, name)
    poll = _poll(max_tasks=2)
    won = worker.ClaimNext(poll, metadata=who("w1", key="k2"))
    fences = [won.fence, won.more_claims[0].fence]
    released = worker.Release(
        worker_pb2.ReleaseRequest(fence=fences[0]), metadata=who("w1", key="rel-1")
    )
    assert released.outcome == types_pb2.OUTCOME_OK
    before = snapshot(store, etcd_client)
    # The released claim is left out; the other is answered as the first try answered it,
    # and the replay writes nothing.
    assert worker.ClaimNext(poll, metadata=who("w1", key="k2")) == won.more_claims[0]
    assert snapshot(store, etcd_client) == before
    worker.Release(worker_pb2.ReleaseRequest(fence=fences[1]), metadata=who("w1", key="rel-2"))
    # None alive: the retry runs as a call whose first try failed would (the claims went back
    # to the queue), and the key now names what it won.
    again = worker.ClaimNext(poll, metadata=who("w1", key="k2"))
    assert again.outcome == types_pb2.OUTCOME_CLAIMED and len(again.more_claims) == 1
    assert {again.fence.task_id, again.more_claims[0].fence.task_id} == {"a", "b"}
    assert [store.tasks.get(n).attempt for n in ("a", "b")] == [2, 2]
    kv = store.ctx.kv.get(store.ctx.keys.keyed_claims("w1", "k2"))
    assert kv is not None
    assert decode(KeyedClaims, kv.value).attempt_ids == (
        again.fence.attempt_id,
        again.more_claims[0].fence.attempt_id,
    )
    assert worker.ClaimNext(poll, metadata=who("w1", key="k2")) == again


def test_the_key_reused_for_another_request_is_already_exists_and_writes_nothing(
    tasks: tasks_pb2_grpc.TaskServiceStub,
    worker: worker_pb2_grpc.WorkerServiceStub,
    store: Store,
    etcd_client: Any,
) -> None:
    _create(tasks, "t")
    _create(tasks, "u", queue="other")
    worker.ClaimNext(_poll(), metadata=who("w1", key="k3"))
    before = snapshot(store, etcd_client)
    with pytest.raises(grpc.RpcError) as refused:
        worker.ClaimNext(_poll("other"), metadata=who("w1", key="k3"))
    assert refused.value.code() == grpc.StatusCode.ALREADY_EXISTS
    assert "idempotency key 'k3' was already used for a different" in (
        refused.value.details() or ""
    )
    assert snapshot(store, etcd_client) == before
    # Keys are the caller's: another principal's same key is a call of its own.
    other = worker.ClaimNext(_poll("other"), metadata=who("w2", key="k3"))
    assert other.outcome == types_pb2.OUTCOME_CLAIMED and other.fence.task_id == "u"


def test_a_malformed_key_is_invalid_argument_and_writes_nothing(
    tasks: tasks_pb2_grpc.TaskServiceStub,
    worker: worker_pb2_grpc.WorkerServiceStub,
    store: Store,
    etcd_client: Any,
) -> None:
    _create(tasks, "t")
    before = snapshot(store, etcd_client)
    with pytest.raises(grpc.RpcError) as refused:
        worker.ClaimNext(_poll(), metadata=who("w1", key="not a key!"))
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "idempotency-key must be 1-128 characters" in (refused.value.details() or "")
    assert snapshot(store, etcd_client) == before


def test_duplicates_racing_for_one_task_claim_it_once_and_get_the_same_answer(
    tasks: tasks_pb2_grpc.TaskServiceStub,
    worker: worker_pb2_grpc.WorkerServiceStub,
    store: Store,
) -> None:
    # Eight tries of one call wait together; one task arrives; then a second one, which no
    # try may take: the call asked for one.
    barrier = threading.Barrier(9)
    answers: list[Any] = []

    def send() -> None:
        barrier.wait()
        answers.append(worker.ClaimNext(_poll(wait=5), metadata=who("w1", key="k4")))

    threads = [threading.Thread(target=send) for _ in range(8)]
    for thread in threads:
        thread.start()
    barrier.wait()
    _create(tasks, "t1")
    _create(tasks, "t2")
    for thread in threads:
        thread.join()
    claimed = [a for a in answers if a.outcome == types_pb2.OUTCOME_CLAIMED]
    # Every try that won or met the key answers the one claim; a try that found nothing
    # before its wait ended says so.
    assert len(claimed) >= 1
    assert {a.fence.SerializeToString() for a in claimed} == {claimed[0].fence.SerializeToString()}
    assert all(
        a.outcome in (types_pb2.OUTCOME_CLAIMED, types_pb2.OUTCOME_NO_READY_TASK) for a in answers
    )
    won = claimed[0].fence.task_id
    other = "t2" if won == "t1" else "t1"
    assert store.tasks.get(won).attempt == 1
    assert (store.tasks.get(other).state, store.tasks.get(other).attempt) == (TaskState.READY, 0)


def test_a_claim_txn_that_meets_its_key_written_writes_nothing_and_replays_the_winner(
    store: Store,
) -> None:
    for name in ("t1", "t2"):
        create(store, name, queue="q")
    # Two tries of one call, both past their read of the key before either claimed.
    first = store.keyed_claims.open("w1", "k5", method=CLAIM_NEXT, digest="d")
    second = store.keyed_claims.open("w1", "k5", method=CLAIM_NEXT, digest="d")
    assert isinstance(first, ClaimKey) and isinstance(second, ClaimKey)
    won = store.claims.claim_next("q", principal="w1", epoch=1, ttl=30, key=first)
    assert won.verdict.outcome is Outcome.CLAIMED and won.fence is not None
    with pytest.raises(KeyTaken) as taken:
        store.claims.claim_next("q", principal="w1", epoch=1, ttl=30, key=second)
    other = "t2" if won.fence.task_id == "t1" else "t1"
    assert (store.tasks.get(other).state, store.tasks.get(other).attempt) == (TaskState.READY, 0)
    # Nothing was written by the loser: the key names the winner's claim only.
    kv = store.ctx.kv.get(store.ctx.keys.keyed_claims("w1", "k5"))
    assert kv is not None and kv.mod_revision == won.fence.claim_generation
    (replayed,) = store.keyed_claims.replay(taken.value.kv, second)
    assert replayed.fence == won.fence
    assert (replayed.lease_expires_at, replayed.lease_remaining) == (
        won.lease_expires_at,
        won.lease_remaining,
    )
    assert (
        replayed.task is not None
        and replayed.task.input == f"input of {won.fence.task_id}".encode()
    )


def test_a_call_run_again_that_meets_its_key_once_more_answers_without_a_claim(
    store: Store,
) -> None:
    for name in ("t1", "t2"):
        create(store, name, queue="q")
    first = store.keyed_claims.open("w1", "k6", method=CLAIM_NEXT, digest="d")
    second = store.keyed_claims.open("w1", "k6", method=CLAIM_NEXT, digest="d")
    won = store.claims.claim_next("q", principal="w1", epoch=1, ttl=30, key=first)
    assert won.fence is not None
    assert store.acceptance.release(won.fence, principal="w1", reason="t").outcome is Outcome.OK
    with pytest.raises(KeyTaken) as taken:
        store.claims.claim_next("q", principal="w1", epoch=1, ttl=30, key=second)
    # Nothing alive: the call may run again, expecting the record it met.
    again = store.keyed_claims.taken(taken.value.kv, second)
    assert isinstance(again, ClaimKey)
    # A third try wins first; the call run again meets the key once more and answers so.
    third = store.keyed_claims.taken(taken.value.kv, second)
    assert isinstance(third, ClaimKey)
    assert store.claims.claim_next("q", principal="w1", epoch=1, ttl=30, key=third).fence
    with pytest.raises(KeyTaken) as met:
        store.claims.claim_next("q", principal="w1", epoch=1, ttl=30, key=again)
    (answer,) = store.keyed_claims.replay(met.value.kv, again)
    assert answer.verdict.outcome is Outcome.CLAIMED  # the third try's claim, alive
    assert answer.fence is not None
    store.acceptance.release(answer.fence, principal="w1", reason="t")
    (ended,) = store.keyed_claims.replay(met.value.kv, again)
    assert ended.verdict.outcome is Outcome.NO_READY_TASK and ended.fence is None
    assert "another try of this call won first, and its claims have ended" in (
        ended.verdict.message
    )


def test_a_record_that_expired_under_a_call_does_not_fail_its_claim(
    store: Store, etcd_client: Any
) -> None:
    create(store, "t1", queue="q")
    etcd_key = store.ctx.keys.keyed_claims("w1", "k7")
    # An earlier try's record whose claims ended, met by this call; then gone (its lease).
    ended = KeyedClaims(CLAIM_NEXT, "d", ("gone",), ("a1-x",), (1.0,), (1.0,), ("",))
    etcd_client.put(etcd_key, encode(ended))
    opened = store.keyed_claims.open("w1", "k7", method=CLAIM_NEXT, digest="d")
    with pytest.raises(KeyTaken) as taken:
        store.claims.claim_next("q", principal="w1", epoch=1, ttl=30, key=opened)
    again = store.keyed_claims.taken(taken.value.kv, opened)
    assert isinstance(again, ClaimKey)
    etcd_client.delete(etcd_key)
    won = store.claims.claim_next("q", principal="w1", epoch=1, ttl=30, key=again)
    assert won.verdict.outcome is Outcome.CLAIMED and won.fence is not None
    kv = store.ctx.kv.get(etcd_key)
    assert kv is not None and decode(KeyedClaims, kv.value).task_ids == ("t1",)


def test_a_retry_into_an_empty_queue_finds_its_first_tries_claim_before_waiting(
    tasks: tasks_pb2_grpc.TaskServiceStub,
    worker: worker_pb2_grpc.WorkerServiceStub,
    store: Store,
    etcd_client: Any,
) -> None:
    _create(tasks, "only")
    poll = _poll(wait=20)
    won = worker.ClaimNext(poll, metadata=who("w1", key="k8"))
    assert won.fence.task_id == "only"
    # The queue is empty now: the retry's poll reads its key before it waits, and answers
    # with the claim (a 20 s wait would outlive the call's 10 s deadline: DEADLINE_EXCEEDED).
    before = snapshot(store, etcd_client)
    assert worker.ClaimNext(poll, metadata=who("w1", key="k8"), timeout=10) == won
    assert snapshot(store, etcd_client) == before


def test_a_keyed_commit_with_next_keys_its_next_claim_the_same_way(
    tasks: tasks_pb2_grpc.TaskServiceStub,
    worker: worker_pb2_grpc.WorkerServiceStub,
    store: Store,
    etcd_client: Any,
) -> None:
    _create(tasks, "first")
    held = worker.ClaimNext(_poll(), metadata=who("w1"))
    _create(tasks, "second")
    commit = _commit_then_next(held)
    committed = worker.Commit(commit, metadata=who("w1", key="k9"))
    assert committed.outcome == types_pb2.OUTCOME_COMMITTED
    assert committed.next.fence.task_id == "second"
    # The key went with the next claim's txn; nothing under the generic path's prefixes.
    kv = store.ctx.kv.get(store.ctx.keys.keyed_claims("w1", "k9"))
    assert kv is not None and kv.mod_revision == committed.next.fence.claim_generation
    record = decode(KeyedClaims, kv.value)
    assert (record.method, record.task_ids) == ("/coordinator.v1.WorkerService/Commit", ("second",))
    stored = etcd_client.get_prefix(store.ctx.keys.prefix + "/idem")
    assert [meta.key for _, meta in stored] == []
    # A retry: the commit answers COMMITTED again, the next claim is the one first won.
    again = worker.Commit(commit, metadata=who("w1", key="k9"))
    assert (again.outcome, again.result_commit_id) == (
        types_pb2.OUTCOME_COMMITTED,
        committed.result_commit_id,
    )
    assert again.next == committed.next
    assert store.tasks.get("second").attempt == 1


def test_a_commit_with_next_under_a_key_used_for_another_call_still_says_it_committed(
    tasks: tasks_pb2_grpc.TaskServiceStub,
    worker: worker_pb2_grpc.WorkerServiceStub,
    store: Store,
) -> None:
    _create(tasks, "first")
    held = worker.ClaimNext(_poll(), metadata=who("w1", key="k10"))
    _create(tasks, "second")
    commit = _commit_then_next(held)
    # The key is met only after the commit ran: the commit's answer stands, the next claim
    # says why it claimed nothing, and the next task is untouched.
    answer = worker.Commit(commit, metadata=who("w1", key="k10"))
    assert answer.outcome == types_pb2.OUTCOME_COMMITTED
    assert answer.next.outcome == types_pb2.OUTCOME_NOT_CLAIMABLE
    assert "idempotency key 'k10' was already used for" in answer.next.message
    assert "no next task was claimed" in answer.next.message
    assert not answer.next.HasField("fence")
    assert store.tasks.get("first").state is TaskState.DONE
    assert (store.tasks.get("second").state, store.tasks.get("second").attempt) == (
        TaskState.READY,
        0,
    )
