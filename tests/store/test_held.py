"""A commit of a claim granted by the same replica decides on what the claim txn wrote, and
its txn pins those records, so it skips the read but never a check (store/attempts/views.py)."""

from __future__ import annotations

from typing import Any

import pytest

from coordinator.domain.decisions import Fence
from coordinator.domain.records import with_changes
from coordinator.domain.states import AttemptEnd, FenceReason, Outcome, TaskState
from coordinator.store import CommitResult, Store
from tests.store.support import RESULT, RESULT_DIGEST, StoreFactory, claim, create


def _reads(store: Store, monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    calls: list[Any] = []
    read = store.ctx.kv.read

    def counted(*ops: Any) -> Any:
        calls.append(ops)
        return read(*ops)

    monkeypatch.setattr(store.ctx.kv, "read", counted)
    return calls


def test_the_remembered_view_is_what_a_read_returns(store: Store) -> None:
    create(store, "t1")
    fence = claim(store, "t1")
    remembered = store.acceptance._held.take(fence)
    assert remembered is not None
    read = store.acceptance.view(fence)
    assert remembered == read
    assert remembered.task.state_version == read.task.state_version == fence.claim_generation
    assert remembered.claim is not None and read.claim is not None
    assert remembered.claim.generation == read.claim.generation
    assert remembered.attempt.claim_generation == read.attempt.claim_generation


def _commit(store: Store, fence: Fence, input_digest: str) -> CommitResult:
    return store.acceptance.commit(
        fence,
        principal="w1",
        input_digest=input_digest,
        result_digest=RESULT_DIGEST,
        result=RESULT,
        result_ref="",
    )


def test_a_commit_through_the_claiming_replica_reads_nothing(
    make_store: StoreFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = make_store(reclaim=False)  # no background loop reads meanwhile
    create(store, "t1")
    fence = claim(store, "t1")
    (attempt,) = store.tasks.attempts("t1")
    reads = _reads(store, monkeypatch)
    outcome = _commit(store, fence, attempt.input_digest)
    assert outcome.verdict.outcome is Outcome.COMMITTED
    assert reads == []
    assert store.tasks.get("t1").state is TaskState.DONE
    (closed,) = store.tasks.attempts("t1")
    assert closed.end is AttemptEnd.COMMITTED


def test_a_commit_through_another_replica_reads_and_commits(
    make_store: StoreFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    claimer, committer = make_store(reclaim=False), make_store(reclaim=False)
    create(claimer, "t1")
    fence = claim(claimer, "t1")
    (attempt,) = claimer.tasks.attempts("t1")
    reads = _reads(committer, monkeypatch)
    assert _commit(committer, fence, attempt.input_digest).verdict.outcome is Outcome.COMMITTED
    assert len(reads) == 1


def test_a_remembered_view_the_task_moved_past_is_not_used(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The task was cancelled after the claim: the pinned txn fails, the read decides."""
    create(store, "t1")
    fence = claim(store, "t1")
    (attempt,) = store.tasks.attempts("t1")
    store.tasks.cancel("t1", by="pm", reason="not needed")
    reads = _reads(store, monkeypatch)
    outcome = _commit(store, fence, attempt.input_digest)
    assert outcome.verdict.outcome is Outcome.CANCELLED
    assert len(reads) >= 1
    assert store.tasks.get("t1").state is TaskState.CANCELLED


def test_a_commit_whose_txns_lose_a_race_reads_once_after_each_and_names_it(
    make_store: StoreFactory, monkeypatch: pytest.MonkeyPatch, etcd_client: Any
) -> None:
    """Both commit txns (the remembered view's and the read's) fail on an epoch flip that is
    undone at once, so every read finds the fence current: the read after the second failed
    txn names the race (TASK_MOVED) without a third read, and nothing is written."""
    store = make_store(reclaim=False)
    create(store, "t1")
    fence = claim(store, "t1")
    (attempt,) = store.tasks.attempts("t1")
    epoch_key, txn = store.ctx.keys.epoch, store.ctx.kv.txn
    writes: list[Any] = []

    def flipped(compares: Any, success: Any = (), failure: Any = (), **options: Any) -> Any:
        if not compares:  # a read
            return txn(compares, success, failure, **options)
        writes.append(compares)
        etcd_client.put(epoch_key, b"2")
        try:
            return txn(compares, success, failure, **options)
        finally:
            etcd_client.put(epoch_key, b"1")

    monkeypatch.setattr(store.ctx.kv, "txn", flipped)
    reads = _reads(store, monkeypatch)
    outcome = _commit(store, fence, attempt.input_digest)
    assert (outcome.verdict.outcome, outcome.verdict.reason) == (
        Outcome.FENCED,
        FenceReason.TASK_MOVED,
    )
    assert (len(writes), len(reads)) == (2, 2)
    assert store.tasks.get("t1").state is TaskState.CLAIMED
    assert store.acceptance.view(fence, with_result=True).result is None


def test_a_retried_commit_after_a_lost_response_is_committed_again(store: Store) -> None:
    create(store, "t1")
    fence = claim(store, "t1")
    (attempt,) = store.tasks.attempts("t1")
    first = _commit(store, fence, attempt.input_digest)
    again = _commit(store, fence, attempt.input_digest)
    assert first.verdict.outcome is again.verdict.outcome is Outcome.COMMITTED
    assert first.result_commit_id == again.result_commit_id


def test_remembered_views_are_bounded_by_count_and_by_input_bytes(store: Store) -> None:
    from coordinator.store.attempts.views import HeldClaims

    create(store, "t1", data=b"x" * 1000)
    fence = claim(store, "t1")
    remembered = store.acceptance._held.take(fence)
    assert remembered is not None
    # The input lives in its own key (schema 2): what a claim remembers holds no copy of it.
    assert remembered.task.input_in_key and remembered.task.input == b""
    # A record of the first schema holds its input, and so does its view: those weigh.
    view = with_changes(remembered, task=with_changes(remembered.task, input=b"x" * 1000))
    fences = [Fence(f"t{i}", "a1", i, 1, 0) for i in range(10)]

    by_count = HeldClaims(capacity=3, input_budget=1 << 20)
    for f in fences:
        by_count.remember(f, view)
    assert len(by_count) == 3
    assert [by_count.take(f) is not None for f in fences] == [False] * 7 + [True] * 3

    by_bytes = HeldClaims(capacity=100, input_budget=2500)  # two inputs of 1000 bytes fit
    for f in fences:
        by_bytes.remember(f, view)
    assert len(by_bytes) == 2
    assert by_bytes.take(fences[-1]) is view and len(by_bytes) == 1
    by_bytes.remember(fences[0], view)
    by_bytes.remember(fences[1], view)
    assert len(by_bytes) == 2  # the budget came back with the take
