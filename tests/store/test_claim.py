"""Claim and ClaimNext against a real etcd: the generation, races, TTL clamping, queue order."""

from __future__ import annotations

import threading
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from coordinator.clock import ManualClock
from coordinator.domain.attempt_in_record import recorded_attempt
from coordinator.domain.decisions import ClaimLimits, Verdict
from coordinator.domain.states import AttemptEnd, Outcome, TaskState
from coordinator.errors import NotFound
from coordinator.store import ClaimResult, Store
from coordinator.store.attempts.views import HeldClaims
from coordinator.store.claims.claim import HERD_SPREAD, ClaimStore
from coordinator.store.claims.gates import ClaimRead
from tests.helpers import RETRY_AT_ONCE
from tests.store.support import (
    StoreFactory,
    claim,
    claim_result,
    commit,
    create,
    raw,
    snapshot,
    wait_claim_gone,
)

# ClaimNext spreads its picks with random.choice; tests pin the pick where it matters.
RANDOM_CHOICE = "coordinator.store.claims.claim.random.choice"


def _assert_generation_is_claim_revision(
    store: Store, etcd_client: Any, result: ClaimResult
) -> None:
    """generation == claim txn revision == claim key create_revision == task mod_revision."""
    assert result.fence is not None and result.task is not None
    keys, fence = store.ctx.keys, result.fence
    generation = fence.claim_generation
    assert raw(etcd_client, keys.claim(fence.task_id)).create_revision == generation
    assert raw(etcd_client, keys.task(fence.task_id)).mod_revision == generation
    # Schema 3: the attempt has no key; the task record holds it, at the same generation.
    assert raw(etcd_client, keys.attempt(fence.task_id, fence.attempt_id)) is None
    attempt = recorded_attempt(store.tasks.get(fence.task_id))
    assert attempt is not None and attempt.claim_generation == generation
    assert result.task.claim_generation == generation
    assert result.task.state_version == generation
    assert store.tasks.get(fence.task_id).claim_generation == generation


def test_claim_hands_out_the_txn_revision_as_generation(store: Store, etcd_client: Any) -> None:
    create(store, "t1")
    result = claim_result(store, "t1", principal="w1", ttl=30)
    assert result.verdict.outcome is Outcome.CLAIMED
    assert result.fence is not None
    assert result.attempt == 1
    assert (result.fence.scheduler_epoch, result.fence.cancel_generation) == (1, 0)
    _assert_generation_is_claim_revision(store, etcd_client, result)
    task = store.tasks.get("t1")
    assert (task.state, task.owner_id, task.attempt_id) == (
        TaskState.CLAIMED,
        "w1",
        result.fence.attempt_id,
    )
    keys = store.ctx.keys
    assert store.ready.first("default", 10) == []
    assert raw(etcd_client, keys.claimed("t1")) is not None
    assert raw(etcd_client, keys.claim("t1")).lease_id == task.lease_id != 0


def test_generation_strictly_increases_across_reclaims(
    make_store: StoreFactory, etcd_client: Any
) -> None:
    store = make_store(reclaim=False)
    create(store, "t1")
    generations = []
    for round_no in range(4):
        result = claim_result(store, "t1", ttl=1 if round_no == 2 else 30)
        assert result.verdict.outcome is Outcome.CLAIMED, (round_no, result.verdict)
        _assert_generation_is_claim_revision(store, etcd_client, result)
        assert result.fence is not None
        generations.append(result.fence.claim_generation)
        if round_no == 2:  # let this one expire; the next claim takes over the dead claim
            wait_claim_gone(store, etcd_client, "t1")
            assert store.tasks.get("t1").state is TaskState.CLAIMED
        else:
            assert store.acceptance.release(result.fence, principal="w1", reason="r").accepted
    assert generations == sorted(set(generations)), generations
    attempts = store.tasks.attempts("t1")
    assert [a.attempt for a in attempts] == [1, 2, 3, 4]
    assert [a.claim_generation for a in attempts] == generations


def test_sixteen_racing_claims_yield_exactly_one_credential(make_store: StoreFactory) -> None:
    store = make_store()
    replicas = [store, make_store()]  # two coordinator replicas on one keyspace
    create(store, "hot")
    barrier = threading.Barrier(16)

    def worker(n: int) -> ClaimResult:
        barrier.wait()
        return replicas[n % 2].claims.claim("hot", principal=f"w{n}", epoch=1, ttl=30)

    with ThreadPoolExecutor(16) as pool:
        results = list(pool.map(worker, range(16)))
    outcomes = Counter(r.verdict.outcome for r in results)
    assert outcomes == {Outcome.CLAIMED: 1, Outcome.ALREADY_CLAIMED: 15}
    winners = [r for r in results if r.fence is not None]
    assert len(winners) == 1
    assert all(r.fence is None for r in results if r.verdict.outcome is not Outcome.CLAIMED)
    task = store.tasks.get("hot")
    assert winners[0].fence is not None
    assert (task.attempt, task.attempt_id) == (1, winners[0].fence.attempt_id)
    assert len(store.tasks.attempts("hot")) == 1


def test_a_live_claim_is_not_claimable_and_nothing_is_written(
    store: Store, etcd_client: Any
) -> None:
    create(store, "t1")
    claim(store, "t1", principal="w1")
    before = snapshot(store, etcd_client)
    result = claim_result(store, "t1", principal="w2")
    assert result.verdict.outcome is Outcome.ALREADY_CLAIMED
    assert result.fence is None
    assert snapshot(store, etcd_client) == before


def test_expected_state_version_must_match(store: Store) -> None:
    create(store, "t1")
    version = store.tasks.get("t1").state_version
    stale = store.claims.claim(
        "t1", principal="w1", epoch=1, ttl=30, expected_state_version=version - 1
    )
    assert (stale.verdict.outcome, stale.fence) == (Outcome.STALE_STATE_VERSION, None)
    ok = store.claims.claim("t1", principal="w1", epoch=1, ttl=30, expected_state_version=version)
    assert ok.verdict.outcome is Outcome.CLAIMED


def test_done_and_cancelled_tasks_are_not_claimable(store: Store) -> None:
    create(store, "done")
    assert commit(store, claim(store, "done")).verdict.outcome is Outcome.COMMITTED
    create(store, "gone")
    store.tasks.cancel("gone", by="pm", reason="no longer needed")
    for task_id in ("done", "gone"):
        result = claim_result(store, task_id, principal="w2")
        assert (result.verdict.outcome, result.fence) == (Outcome.NOT_CLAIMABLE, None)


def test_claim_of_an_unknown_task_is_not_found(store: Store) -> None:
    with pytest.raises(NotFound):
        claim_result(store, "nope")


@pytest.mark.parametrize(
    ("min_ttl", "requested", "granted"), [(1, 1000, 30), (2, 1, 2), (5, 3, 5), (2, 7, 7)]
)
def test_ttl_is_clamped_and_etcd_grants_the_clamp(
    make_store: StoreFactory,
    etcd_client: Any,
    min_ttl: int,
    requested: int,
    granted: int,
) -> None:
    store = make_store(limits=ClaimLimits(min_ttl=min_ttl, max_ttl=30, retry=RETRY_AT_ONCE))
    create(store, "t1")
    result = claim_result(store, "t1", ttl=requested)
    assert result.verdict.outcome is Outcome.CLAIMED
    assert result.ttl == granted
    lease = etcd_client.get_lease_info(raw(etcd_client, store.ctx.keys.claim("t1")).lease_id)
    assert lease.grantedTTL == granted
    assert 0 < lease.TTL <= granted
    (attempt,) = store.tasks.attempts("t1")
    assert attempt.ttl == granted


def _queue_of(store: Store, clock: ManualClock, specs: list[tuple[str, int]]) -> None:
    for task_id, priority in specs:
        create(store, task_id, priority=priority, queue="q")
        clock.advance(1)


def test_claim_next_takes_higher_priority_first_then_fifo(
    store: Store, clock: ManualClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    _queue_of(store, clock, [("low-1", 1), ("high-1", 9), ("low-2", 1), ("high-2", 9)])
    _queue_of(store, clock, [("mid-1", 5), ("low-0", 0)])
    monkeypatch.setattr(RANDOM_CHOICE, lambda seq: seq[0])
    order = []
    for _ in range(6):
        result = store.claims.claim_next("q", principal="w1", epoch=1, ttl=30)
        assert result.verdict.outcome is Outcome.CLAIMED, result.verdict
        assert result.fence is not None
        order.append(result.fence.task_id)
    assert order == ["high-1", "high-2", "mid-1", "low-1", "low-2", "low-0"]
    empty = store.claims.claim_next("q", principal="w1", epoch=1, ttl=30)
    assert (empty.verdict.outcome, empty.fence) == (Outcome.NO_READY_TASK, None)


def test_claim_next_on_an_empty_or_other_queue_is_no_ready_task(store: Store) -> None:
    empty = store.claims.claim_next("default", principal="w1", epoch=1, ttl=30)
    assert (empty.verdict.outcome, empty.fence) == (Outcome.NO_READY_TASK, None)
    create(store, "t1", queue="other")
    result = store.claims.claim_next("default", principal="w1", epoch=1, ttl=30)
    assert result.verdict.outcome is Outcome.NO_READY_TASK
    assert store.tasks.get("t1").state is TaskState.READY


def test_claim_next_spreads_only_over_the_head_of_the_queue(
    store: Store, clock: ManualClock
) -> None:
    ready = [f"t{n:02d}" for n in range(20)]
    _queue_of(store, clock, [(task_id, 0) for task_id in ready])
    for _ in range(8):
        result = store.claims.claim_next("q", principal="w1", epoch=1, ttl=30)
        assert result.fence is not None, result.verdict
        assert result.fence.task_id in ready[:HERD_SPREAD], (result, ready)
        ready.remove(result.fence.task_id)


def test_claim_next_drains_a_priority_before_the_next_one(store: Store, clock: ManualClock) -> None:
    _queue_of(store, clock, [(f"bulk-{n}", 0) for n in range(6)])
    _queue_of(store, clock, [(f"urgent-{n}", 9) for n in range(3)])
    assert [k.rsplit("/", 1)[1] for k in store.ready.first("q", 8)] == [
        "urgent-0",
        "urgent-1",
        "urgent-2",
    ]
    taken = []
    for _ in range(9):  # the real random spread
        result = store.claims.claim_next("q", principal="w1", epoch=1, ttl=30)
        assert result.fence is not None, result.verdict
        taken.append(result.fence.task_id)
    assert sorted(taken[:3]) == ["urgent-0", "urgent-1", "urgent-2"]
    assert sorted(taken[3:]) == [f"bulk-{n}" for n in range(6)]


def test_claim_next_never_picks_a_lower_priority_while_a_higher_is_ready(
    store: Store, clock: ManualClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    _queue_of(store, clock, [("urgent", 9)] + [(f"bulk-{n}", 0) for n in range(7)])
    # Any pick within the spread is allowed by the design; take the last one.
    monkeypatch.setattr(RANDOM_CHOICE, lambda seq: seq[-1])
    result = store.claims.claim_next("q", principal="w1", epoch=1, ttl=30)
    assert result.fence is not None
    assert result.fence.task_id == "urgent"


def test_a_takeover_claim_reads_the_named_attempt_and_closes_it_in_its_txn(
    make_store: StoreFactory, etcd_client: Any, monkeypatch: pytest.MonkeyPatch, clock: ManualClock
) -> None:
    """The attempt a takeover closes as EXPIRED is read by its name at the decision's revision
    (never the task's whole attempts range): one read, that key, one lease grant and the claim
    txn are all the etcd round trips of the claim."""
    store = make_store(reclaim=False)  # nobody moves the task to READY: the claim takes it over
    create(store, "t1")
    old = claim(store, "t1", principal="A", ttl=1)
    wait_claim_gone(store, etcd_client, "t1")
    kv = store.ctx.kv
    trips: list[object] = []
    txn, grant, range_page = kv.txn, kv.grant, kv.range_page

    def counted_txn(compares: Any, success: Any = (), failure: Any = (), **options: Any) -> Any:
        trips.append("txn" if compares else "read")  # a read is a compare-less txn
        return txn(compares, success, failure, **options)

    def counted_grant(ttl: int) -> Any:
        trips.append("grant")
        return grant(ttl)

    def counted_range(start: str, end: str, **options: Any) -> Any:
        trips.append(("range", start, end))
        return range_page(start, end, **options)

    monkeypatch.setattr(kv, "txn", counted_txn)
    monkeypatch.setattr(kv, "grant", counted_grant)
    monkeypatch.setattr(kv, "range_page", counted_range)
    clock.advance(5.0)
    new = claim(store, "t1", principal="B")
    named = store.ctx.keys.attempt("t1", old.attempt_id)
    assert trips == ["read", ("range", named, named + "\0"), "grant", "txn"]
    monkeypatch.undo()
    ended = {a.attempt_id: (a.end, a.ended_at) for a in store.tasks.attempts("t1")}
    assert ended == {
        old.attempt_id: (AttemptEnd.EXPIRED, clock.now()),
        new.attempt_id: (AttemptEnd.RUNNING, 0.0),
    }
    assert new.claim_generation > old.claim_generation


def test_a_gate_stops_a_claim_with_its_answer_and_nothing_is_written(
    store: Store, etcd_client: Any
) -> None:
    """Gates are given to the ClaimStore; each sees the claim's read and may answer for it."""
    create(store, "t1")
    seen: list[tuple[str, Outcome, str, int]] = []

    class Closed:
        def check(self, read: ClaimRead, *, by: str, epoch: int) -> Verdict | None:
            seen.append((read.task.task_id, read.verdict.outcome, by, epoch))
            return Verdict(Outcome.NEEDS_APPROVAL, message="closed by the test")

    class Open:
        def check(self, read: ClaimRead, *, by: str, epoch: int) -> Verdict | None:
            return None

    gated = ClaimStore(store.ctx, store.ready, HeldClaims(), (Open(), Closed()))
    before = snapshot(store, etcd_client)
    result = gated.claim("t1", principal="w1", epoch=1, ttl=30)
    assert result.verdict == Verdict(Outcome.NEEDS_APPROVAL, message="closed by the test")
    assert result.fence is None
    assert seen == [("t1", Outcome.CLAIMED, "w1", 1)]
    assert snapshot(store, etcd_client) == before
    assert claim(store, "t1").task_id == "t1"  # the store's own gates let it through
