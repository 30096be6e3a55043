"""Commit, StageResult and Release: fenced, exactly once per task revision, retry-safe."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from coordinator.domain.decisions import Fence
from coordinator.domain.digests import digest_of
from coordinator.domain.records import StagedResult, decode
from coordinator.domain.states import AttemptEnd, FenceReason, Outcome, TaskState
from coordinator.errors import PermissionDenied
from coordinator.store import CommitResult, Store
from tests.store.support import (
    RESULT_DIGEST,
    StoreFactory,
    claim,
    commit,
    create,
    raw,
    results,
    snapshot,
    under,
    wait_claim_gone,
)


def _expired_then_reclaimed(store: Store, etcd_client: Any) -> tuple[Fence, Fence]:
    """A claims with a short lease and goes quiet; once it expired, B claims. (A, B)."""
    create(store, "t1")
    old = claim(store, "t1", principal="A", ttl=1)
    wait_claim_gone(store, etcd_client, "t1")
    new = claim(store, "t1", principal="B")
    return old, new


def _attempt_end(store: Store, fence: Fence) -> AttemptEnd:
    (attempt,) = [
        a for a in store.tasks.attempts(fence.task_id) if a.attempt_id == fence.attempt_id
    ]
    return attempt.end


def test_commit_makes_the_result_canonical_and_ends_the_claim(
    store: Store, etcd_client: Any
) -> None:
    create(store, "t1")
    fence = claim(store, "t1")
    lease_id = store.tasks.get("t1").lease_id
    result = commit(store, fence)
    assert result.verdict.outcome is Outcome.COMMITTED
    assert result.result_commit_id == f"{fence.attempt_id}@{fence.claim_generation}"
    assert result.state is TaskState.DONE
    (canonical,) = results(store, etcd_client)
    assert (canonical.attempt_id, canonical.claim_generation, canonical.result_digest) == (
        fence.attempt_id,
        fence.claim_generation,
        RESULT_DIGEST,
    )
    task = store.tasks.get("t1")
    assert (task.state, task.result_commit_id, task.result_digest) == (
        TaskState.DONE,
        result.result_commit_id,
        RESULT_DIGEST,
    )
    keys = store.ctx.keys
    assert raw(etcd_client, keys.claim("t1")) is None
    assert raw(etcd_client, keys.claimed("t1")) is None
    # The lease holds no key and waits in this replica's pool for the next claim
    # (store/etcd/leases.py).
    assert list(etcd_client.get_lease_info(lease_id).keys) == []
    assert store.ctx.leases.acquire(30).lease_id == lease_id
    assert _attempt_end(store, fence) is AttemptEnd.COMMITTED


def test_commit_of_a_review_task_goes_to_review(store: Store) -> None:
    create(store, "t1", review=True)
    result = commit(store, claim(store, "t1"))
    assert (result.verdict.outcome, result.state) == (Outcome.COMMITTED, TaskState.REVIEW)
    assert store.tasks.get("t1").state is TaskState.REVIEW


def test_old_owner_after_reclaim_is_fenced_superseded(
    make_store: StoreFactory, etcd_client: Any
) -> None:
    store = make_store(reclaim=False)
    old, new = _expired_then_reclaimed(store, etcd_client)
    assert new.claim_generation > old.claim_generation
    before = snapshot(store, etcd_client)
    fenced = commit(store, old, principal="A")
    assert (fenced.verdict.outcome, fenced.verdict.reason) == (
        Outcome.FENCED,
        FenceReason.SUPERSEDED,
    )
    assert (fenced.result_commit_id, fenced.state) == ("", None)
    assert snapshot(store, etcd_client) == before
    assert commit(store, new, principal="B").verdict.outcome is Outcome.COMMITTED
    late = commit(store, old, principal="A", result=b"stale")
    assert (late.verdict.outcome, late.verdict.reason) == (Outcome.FENCED, FenceReason.SUPERSEDED)
    (canonical,) = results(store, etcd_client)
    assert (canonical.attempt_id, canonical.owner_id) == (new.attempt_id, "B")
    assert _attempt_end(store, old) is AttemptEnd.EXPIRED


def test_old_owner_before_anyone_reclaimed_is_fenced_lease_expired(
    make_store: StoreFactory, etcd_client: Any
) -> None:
    store = make_store(reclaim=False)
    create(store, "t1")
    fence = claim(store, "t1", ttl=1)
    wait_claim_gone(store, etcd_client, "t1")
    expired = (Outcome.FENCED, FenceReason.LEASE_EXPIRED)
    result = commit(store, fence)
    assert (result.verdict.outcome, result.verdict.reason) == expired
    assert store.tasks.get("t1").state is TaskState.CLAIMED
    assert store.reclaimer.scan() == 1
    assert store.tasks.get("t1").state is TaskState.READY
    result = commit(store, fence)
    assert (result.verdict.outcome, result.verdict.reason) == expired
    assert results(store, etcd_client) == []


def test_a_retried_commit_after_a_lost_response_is_committed_again(
    store: Store, etcd_client: Any
) -> None:
    create(store, "t1")
    fence = claim(store, "t1")
    first, retry = commit(store, fence), commit(store, fence)
    assert first.verdict.outcome is retry.verdict.outcome is Outcome.COMMITTED
    assert first.result_commit_id == retry.result_commit_id != ""
    assert first.state is retry.state is TaskState.DONE
    results_prefix = store.ctx.keys.prefix + "/results/"
    assert list(under(etcd_client, results_prefix)) == [store.ctx.keys.result("t1", 1)]
    before = snapshot(store, etcd_client)
    other = commit(store, fence, result=b"a different result")
    assert (other.verdict.outcome, other.verdict.reason) == (
        Outcome.FENCED,
        FenceReason.ALREADY_COMMITTED,
    )
    assert snapshot(store, etcd_client) == before
    (canonical,) = results(store, etcd_client)
    assert canonical.result_digest == RESULT_DIGEST


def _race(*calls: Any) -> list[CommitResult]:
    barrier = threading.Barrier(len(calls))

    def run(call: Any) -> CommitResult:
        barrier.wait()
        return call()  # type: ignore[no-any-return]

    with ThreadPoolExecutor(len(calls)) as pool:
        return list(pool.map(run, calls))


def test_racing_commits_of_old_and_new_attempt_commit_only_the_new(
    make_store: StoreFactory, etcd_client: Any
) -> None:
    store = make_store(reclaim=False)
    old, new = _expired_then_reclaimed(store, etcd_client)
    stale, current = _race(
        lambda: commit(store, old, principal="A", result=b"A"),
        lambda: commit(store, new, principal="B", result=b"B"),
    )
    assert (stale.verdict.outcome, stale.verdict.reason) == (
        Outcome.FENCED,
        FenceReason.SUPERSEDED,
    )
    assert current.verdict.outcome is Outcome.COMMITTED
    (canonical,) = results(store, etcd_client)
    assert (canonical.attempt_id, canonical.result_digest) == (new.attempt_id, digest_of(b"B"))


@pytest.mark.parametrize("iteration", range(5))
def test_racing_commits_of_one_attempt_with_two_digests_commit_once(
    store: Store, etcd_client: Any, iteration: int
) -> None:
    task_id = f"t{iteration}"
    create(store, task_id)
    fence = claim(store, task_id)
    outcomes = _race(
        lambda: commit(store, fence, result=b"X"), lambda: commit(store, fence, result=b"Y")
    )
    verdicts = sorted((r.verdict.outcome, r.verdict.reason) for r in outcomes)
    assert verdicts == [
        (Outcome.COMMITTED, FenceReason.NONE),
        (Outcome.FENCED, FenceReason.ALREADY_COMMITTED),
    ]
    (canonical,) = results(store, etcd_client)
    winner = b"X" if outcomes[0].verdict.outcome is Outcome.COMMITTED else b"Y"
    assert canonical.result_digest == digest_of(winner)


def test_stage_result_of_a_fenced_attempt_is_ok_not_current_and_never_canonical(
    make_store: StoreFactory, etcd_client: Any
) -> None:
    store = make_store(reclaim=False)
    old, new = _expired_then_reclaimed(store, etcd_client)
    staged = store.acceptance.stage_result(
        old, principal="A", result_digest=digest_of(b"A"), result=b"A", result_ref=""
    )
    assert (staged.verdict.outcome, staged.current) == (Outcome.OK, False)
    value, _ = etcd_client.get(store.ctx.keys.staging("t1", old.attempt_id))
    record = decode(StagedResult, value)
    assert (record.attempt_id, record.claim_generation, record.result) == (
        old.attempt_id,
        old.claim_generation,
        b"A",
    )
    assert results(store, etcd_client) == []
    assert store.tasks.get("t1").result_digest == ""
    assert commit(store, new, principal="B", result=b"B").verdict.outcome is Outcome.COMMITTED
    (canonical,) = results(store, etcd_client)
    assert (canonical.attempt_id, canonical.result_digest) == (new.attempt_id, digest_of(b"B"))


def test_stage_result_of_the_holder_is_current(store: Store) -> None:
    create(store, "t1")
    fence = claim(store, "t1")
    staged = store.acceptance.stage_result(
        fence, principal="w1", result_digest=RESULT_DIGEST, result=b"r", result_ref=""
    )
    assert (staged.verdict.outcome, staged.current) == (Outcome.OK, True)
    assert store.tasks.get("t1").state is TaskState.CLAIMED


@pytest.mark.parametrize("call", ["commit", "stage_result", "release", "authorize_tool"])
def test_another_principal_is_denied_and_nothing_changes(
    store: Store, etcd_client: Any, call: str
) -> None:
    create(store, "t1")
    fence = claim(store, "t1", principal="owner")
    before = snapshot(store, etcd_client)
    acceptance = store.acceptance
    with pytest.raises(PermissionDenied):
        if call == "commit":
            commit(store, fence, principal="intruder")
        elif call == "stage_result":
            acceptance.stage_result(
                fence, principal="intruder", result_digest=RESULT_DIGEST, result=b"", result_ref=""
            )
        elif call == "release":
            acceptance.release(fence, principal="intruder", reason="")
        else:
            acceptance.authorize_tool(fence, principal="intruder", tool="git", action="push")
    assert snapshot(store, etcd_client) == before
    assert commit(store, fence, principal="owner").verdict.outcome is Outcome.COMMITTED


def test_release_returns_the_task_and_fences_the_released_credential(
    store: Store, etcd_client: Any
) -> None:
    create(store, "t1")
    fence = claim(store, "t1")
    lease_id = store.tasks.get("t1").lease_id
    released = store.acceptance.release(fence, principal="w1", reason="give up")
    assert released.outcome is Outcome.OK
    task = store.tasks.get("t1")
    assert (task.state, task.claim_generation) == (TaskState.READY, fence.claim_generation)
    assert raw(etcd_client, store.ctx.keys.claim("t1")) is None
    assert list(etcd_client.get_lease_info(lease_id).keys) == []
    assert store.ctx.leases.acquire(30).lease_id == lease_id  # pooled, not revoked
    assert _attempt_end(store, fence) is AttemptEnd.RELEASED
    expected = (Outcome.FENCED, FenceReason.RELEASED)
    acceptance = store.acceptance
    verdicts = [
        commit(store, fence).verdict,
        store.renewals.renew(fence, principal="w1", progress="p").verdict,
        acceptance.authorize_tool(fence, principal="w1", tool="t", action="a"),
        acceptance.release(fence, principal="w1", reason="again"),
    ]
    assert [(v.outcome, v.reason) for v in verdicts] == [expected] * 4
    again = store.claims.claim_next("default", principal="w2", epoch=1, ttl=30)
    assert again.fence is not None and again.fence.task_id == "t1"
    assert again.fence.claim_generation > fence.claim_generation
    superseded = commit(store, fence)
    assert (superseded.verdict.outcome, superseded.verdict.reason) == (
        Outcome.FENCED,
        FenceReason.SUPERSEDED,
    )
