"""Lease expiry reclaims work: the reclaimer (scan and watch), and a direct claim before it."""

from __future__ import annotations

from typing import Any

from coordinator.clock import ManualClock
from coordinator.domain.retry import attempts_counted
from coordinator.domain.states import AttemptEnd, Op, Outcome, TaskState
from coordinator.store import Store
from coordinator.store.attempts.reclaimer import RECLAIMER
from coordinator.store.types import TaskSpec
from tests.helpers import eventually
from tests.store.support import (
    StoreFactory,
    claim,
    claim_result,
    commit,
    create,
    events,
    raw,
    wait_claim_gone,
)


def _assert_reclaimed(store: Store, etcd_client: Any, task_id: str, generation: int) -> None:
    """READY again, the attempt EXPIRED, one RECLAIM event, and back in the ready index."""
    task = store.tasks.get(task_id)
    assert (task.state, task.lease_id, task.claim_generation) == (TaskState.READY, 0, generation)
    (attempt,) = store.tasks.attempts(task_id)
    assert attempt.end is AttemptEnd.EXPIRED
    log = events(store, etcd_client, task_id)
    assert [e.op for e in log] == [Op.CREATE, Op.CLAIM, Op.RECLAIM]
    reclaim = log[-1]
    assert (reclaim.from_state, reclaim.to_state, reclaim.by) == (
        TaskState.CLAIMED,
        TaskState.READY,
        RECLAIMER,
    )
    assert (reclaim.attempt_id, reclaim.claim_generation) == (attempt.attempt_id, generation)
    keys = store.ctx.keys
    assert raw(etcd_client, keys.claimed(task_id)) is None
    ready_key = keys.ready(task.queue, task.priority, task.ready_seq, task_id)
    assert raw(etcd_client, ready_key) is not None
    # This replica's in-memory ready index follows (the watch may deliver it a moment later).
    eventually(lambda: store.ready.first(task.queue, 10) == [ready_key], timeout=5)


def test_scan_returns_an_expired_task_to_ready(
    make_store: StoreFactory, etcd_client: Any, clock: ManualClock
) -> None:
    store = make_store(reclaim=False)
    create(store, "t1")
    fence = claim(store, "t1", ttl=1)
    assert store.reclaimer.scan() == 0  # the claim is alive
    wait_claim_gone(store, etcd_client, "t1")
    assert store.tasks.get("t1").state is TaskState.CLAIMED  # nobody reclaimed yet
    clock.advance(3)
    assert store.reclaimer.scan() == 1
    _assert_reclaimed(store, etcd_client, "t1", fence.claim_generation)
    (attempt,) = store.tasks.attempts("t1")
    assert attempt.ended_at == clock.now()
    assert store.reclaimer.scan() == 0  # idempotent
    assert len(events(store, etcd_client, "t1")) == 3
    again = store.claims.claim_next("default", principal="w2", epoch=1, ttl=30)
    assert again.fence is not None
    assert again.fence.claim_generation > fence.claim_generation


def test_the_watch_reclaims_an_expired_task(store: Store, etcd_client: Any) -> None:
    create(store, "t1")
    fence = claim(store, "t1", ttl=1)
    # No periodic scan runs in this store: only the watch on the claims prefix can do this.
    eventually(
        lambda: store.tasks.get("t1").state is TaskState.READY,
        timeout=15,
        message="the reclaimer's watch did not return the task to READY",
    )
    _assert_reclaimed(store, etcd_client, "t1", fence.claim_generation)


def test_reclaimers_of_several_replicas_reclaim_once(
    make_store: StoreFactory, etcd_client: Any
) -> None:
    replicas = [make_store(), make_store(), make_store()]
    create(replicas[0], "t1")
    fence = claim(replicas[0], "t1", ttl=1)
    eventually(lambda: replicas[1].tasks.get("t1").state is TaskState.READY, timeout=15)
    assert [r.reclaimer.scan() for r in replicas] == [0, 0, 0]
    _assert_reclaimed(replicas[2], etcd_client, "t1", fence.claim_generation)


def test_a_direct_claim_of_an_expired_task_works_before_the_reclaimer(
    make_store: StoreFactory, etcd_client: Any
) -> None:
    store = make_store(reclaim=False)
    create(store, "t1")
    old = claim(store, "t1", principal="A", ttl=1)
    wait_claim_gone(store, etcd_client, "t1")
    assert store.tasks.get("t1").state is TaskState.CLAIMED
    new = claim(store, "t1", principal="B")
    assert new.claim_generation > old.claim_generation
    first, second = store.tasks.attempts("t1")
    assert (first.attempt_id, first.end) == (old.attempt_id, AttemptEnd.EXPIRED)
    assert (second.attempt_id, second.end, second.owner_id) == (
        new.attempt_id,
        AttemptEnd.RUNNING,
        "B",
    )
    log = events(store, etcd_client, "t1")
    assert [(e.op, e.from_state, e.to_state) for e in log] == [
        (Op.CREATE, None, TaskState.READY),
        (Op.CLAIM, TaskState.READY, TaskState.CLAIMED),
        (Op.CLAIM, TaskState.CLAIMED, TaskState.CLAIMED),
    ]
    assert store.reclaimer.scan() == 0  # the new claim is alive: nothing to reclaim
    assert store.reclaimer.reclaim("t1") is False
    assert commit(store, new, principal="B").verdict.outcome is Outcome.COMMITTED


def test_reclaim_leaves_live_and_finished_tasks_alone(
    make_store: StoreFactory, etcd_client: Any
) -> None:
    store = make_store(reclaim=False)
    create(store, "live")
    create(store, "done")
    create(store, "ready")
    claim(store, "live")
    assert commit(store, claim(store, "done")).verdict.outcome is Outcome.COMMITTED
    before = {t: len(events(store, etcd_client, t)) for t in ("live", "done", "ready")}
    assert [store.reclaimer.reclaim(t) for t in ("live", "done", "ready", "missing")] == [False] * 4
    assert store.reclaimer.scan() == 0
    assert {t: len(events(store, etcd_client, t)) for t in before} == before
    assert store.tasks.get("live").state is TaskState.CLAIMED


def test_a_claim_that_loses_its_txn_to_a_reclaim_claims_again(
    make_store: StoreFactory, etcd_client: Any, monkeypatch: Any
) -> None:
    """A direct claim decides on an expired claim, then the reclaimer's CAS lands before the
    claim txn: nobody holds the task, so the claim reads again and wins (not ALREADY_CLAIMED)."""
    store = make_store(reclaim=False)
    create(store, "t1")
    first = claim(store, "t1", ttl=1)
    wait_claim_gone(store, etcd_client, "t1")
    kv, grant = store.ctx.kv, store.ctx.kv.grant
    raced: list[bool] = []

    def grant_after_a_reclaim(ttl: int) -> tuple[int, int]:
        if not raced:  # between the claim's decision and its txn, once
            raced.append(store.reclaimer.reclaim("t1"))
        return grant(ttl)

    monkeypatch.setattr(kv, "grant", grant_after_a_reclaim)
    result = store.claims.claim("t1", principal="w2", epoch=1, ttl=30)
    assert raced == [True]
    assert result.verdict.outcome is Outcome.CLAIMED, result.verdict
    assert result.fence is not None and result.fence.claim_generation > first.claim_generation
    assert [e.op for e in events(store, etcd_client, "t1")] == [
        Op.CREATE,
        Op.CLAIM,
        Op.RECLAIM,
        Op.CLAIM,
    ]


def test_a_claim_an_epoch_bump_revoked_costs_its_task_no_attempt(
    store: Store, etcd_client: Any
) -> None:
    """An operator's `epoch bump --revoke-leases` (a rollback drill) ends every held claim:
    the task is READY again at once, its retry budget as it was, and the event says why."""
    create(store, "t1")
    fence = claim(store, "t1")
    before = attempts_counted(store.tasks.get("t1"))
    epoch, revoked = store.admin.bump_epoch_revoking()
    assert revoked == 1
    eventually(lambda: store.tasks.get("t1").state is TaskState.READY, timeout=15)
    task = store.tasks.get("t1")
    assert attempts_counted(task) == before - 1  # as before the claim that was fenced
    (attempt,) = store.tasks.attempts("t1")
    assert attempt.end is AttemptEnd.EXPIRED
    reclaim = events(store, etcd_client, "t1")[-1]
    assert (reclaim.op, reclaim.detail) == (
        Op.RECLAIM,
        f"fenced by the epoch bump to {epoch} (the claim carried {fence.scheduler_epoch})",
    )


def test_a_claim_taking_over_a_claim_an_epoch_bump_revoked_costs_its_task_no_attempt(
    make_store: StoreFactory,
) -> None:
    """The same revoked claim when a worker's claim gets there before the reclaimer: the
    takeover decides as the reclaimer would. It counted the fenced attempt: five rollback
    drills dead-lettered a task with max_attempts 5 whenever a worker was the first."""
    store = make_store(reclaim=False)  # nobody moves the task to READY: the claim takes it over
    store.tasks.create(
        TaskSpec(task_id="t1", queue="q", input=b"x", retry=(("max_attempts", 1),)), by="pm"
    )
    first = claim(store, "t1", principal="A")
    epoch, revoked = store.admin.bump_epoch_revoking()
    assert revoked == 1
    second = claim(store, "t1", principal="B", epoch=epoch)
    task = store.tasks.get("t1")
    assert (task.attempt, attempts_counted(task), task.last_error) == (2, 1, "")
    assert second.attempt_id != first.attempt_id
    # The attempt it took over was its own lease's end: counted, and the budget of 1 is spent.
    store.admin.revoke_leases(before_revision=second.claim_generation + 1)
    refused = claim_result(store, "t1", principal="C", epoch=epoch)
    assert refused.verdict.outcome is Outcome.NOT_CLAIMABLE
    assert "all 1 attempts used" in refused.verdict.message
