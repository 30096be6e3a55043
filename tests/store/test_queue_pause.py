"""Pausing one queue's claims: the gate, the claim txn's compare, the bound, and drain status
counted per queue."""

from __future__ import annotations

from typing import Any

import pytest

from coordinator.domain.decisions import Verdict
from coordinator.domain.digests import digest_of
from coordinator.domain.states import Outcome
from coordinator.errors import ResourceExhausted
from coordinator.store import Store
from coordinator.store.attempts.views import HeldClaims
from coordinator.store.claims.claim import ClaimStore
from coordinator.store.claims.gates import ClaimRead, QueuePauseGate
from coordinator.store.control.admin import MAX_PAUSED_QUEUES
from tests.store.support import claim, claim_result, commit, create, snapshot


def test_a_paused_queue_refuses_claim_and_claim_next_and_the_others_claim_on(
    store: Store, etcd_client: Any
) -> None:
    for task_id, queue in (("a1", "a"), ("a2", "a"), ("b1", "b")):
        create(store, task_id, queue=queue)
    store.admin.pause_claims("rollback of a", "a")
    assert (store.admin.paused_queues(), store.admin.claims_paused()) == (["a"], False)

    before = snapshot(store, etcd_client)
    by_id = claim_result(store, "a1").verdict
    by_queue = store.claims.claim_next("a", principal="w1", epoch=1, ttl=30).verdict
    refused = "new claims of queue 'a' are paused by an admin"
    assert (by_id.outcome, by_id.message) == (Outcome.CLAIMS_PAUSED, refused)
    assert (by_queue.outcome, by_queue.message) == (Outcome.CLAIMS_PAUSED, refused)
    assert snapshot(store, etcd_client) == before  # refused without a write
    assert claim(store, "b1").task_id == "b1"

    store.admin.resume_claims("a")
    assert store.admin.paused_queues() == []
    # ClaimNext kept the queue's ready hints: both tasks are claimable again.
    claimed = {
        store.claims.claim_next("a", principal="w1", epoch=1, ttl=30).verdict.outcome
        for _ in range(2)
    }
    assert claimed == {Outcome.CLAIMED}


def test_the_global_pause_and_a_queue_pause_are_lifted_separately(store: Store) -> None:
    create(store, "a1", queue="a")
    store.admin.pause_claims("everything")
    store.admin.pause_claims("a too", "a")
    store.admin.resume_claims()  # the global one only
    assert claim_result(store, "a1").verdict.outcome is Outcome.CLAIMS_PAUSED
    store.admin.resume_claims("a")
    assert claim_result(store, "a1").verdict.outcome is Outcome.CLAIMED


class PauseMidway:
    """A gate that pauses the queue after the claim read: an admin landing in between."""

    def __init__(self, store: Store) -> None:
        self._store = store
        self.fired = 0

    def check(self, read: ClaimRead, *, by: str, epoch: int) -> Verdict | None:
        if not self.fired:
            self.fired += 1
            self._store.admin.pause_claims("landed mid-claim", read.task.queue)
        return None


def test_a_pause_landing_between_the_read_and_the_txn_fails_the_txn(store: Store) -> None:
    create(store, "a1", queue="a")
    midway = PauseMidway(store)
    claims = ClaimStore(store.ctx, store.ready, HeldClaims(), [QueuePauseGate(), midway])
    result = claims.claim("a1", principal="w1", epoch=1, ttl=30)
    assert (midway.fired, result.verdict.outcome, result.fence) == (1, Outcome.CLAIMS_PAUSED, None)
    assert store.tasks.get("a1").attempt == 0


def test_at_most_max_paused_queues(store: Store) -> None:
    for i in range(MAX_PAUSED_QUEUES):
        store.admin.pause_claims("r", f"q{i}")
    store.admin.pause_claims("a new reason", "q0")  # already paused: no new key
    with pytest.raises(ResourceExhausted, match=f"{MAX_PAUSED_QUEUES} queues are paused already"):
        store.admin.pause_claims("r", "one-more")
    assert len(store.admin.paused_queues()) == MAX_PAUSED_QUEUES


def test_drain_status_of_a_queue_counts_its_tasks_only(store: Store) -> None:
    for task_id, queue in (("a1", "a"), ("a2", "a"), ("b1", "b")):
        create(store, task_id, queue=queue)
    a1, a2, b1 = claim(store, "a1"), claim(store, "a2"), claim(store, "b1")
    store.acceptance.stage_result(
        a2, principal="w1", result_digest=digest_of(b"s"), result=b"s", result_ref=""
    )
    prepared = store.effects.prepare(
        b1, principal="w1", node_id="n", effect_slot="mail", payload_digest=digest_of(b"p")
    )
    assert prepared.verdict.accepted
    store.admin.pause_claims("rollback of a", "a")

    def counts(queue: str) -> tuple[int, int, int, bool]:
        s = store.admin.drain_status(queue)
        return s.active_leases, s.unknown_effects, s.staged_uncommitted, s.drained

    assert counts("a") == (2, 0, 1, False)
    assert counts("b") == (1, 1, 0, False)  # not paused, and busy
    assert commit(store, a1).verdict.outcome is Outcome.COMMITTED
    store.acceptance.release(a2, principal="w1", reason="rollback")
    assert counts("a") == (0, 0, 0, True)  # b's claim and effect do not hold a up
    whole = store.admin.drain_status()
    assert (whole.active_leases, whole.drained, whole.queue_paused) == (1, False, False)
