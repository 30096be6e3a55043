"""Owned reconciliation in the store, against a real etcd (ManualClock for the deadlines): the
reconciliation opens with UNKNOWN, nobody is handed the task again and again, the deadline
escalates it to NEEDS_APPROVAL exactly once, and a resolution in time closes it."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pytest

from coordinator.clock import ManualClock
from coordinator.domain.digests import digest_of
from coordinator.domain.effects import EffectAction, EffectState
from coordinator.domain.reconcile import Reconciliation
from coordinator.domain.records import decode
from coordinator.domain.states import Op, Outcome, TaskState
from coordinator.errors import FailedPrecondition, PermissionDenied
from coordinator.store import Store
from coordinator.store.effects.reconcile import SWEEPER
from tests.helpers import eventually
from tests.reconcile.support import (
    TIMEOUT,
    escalations,
    limits,
    ops_of,
    prepare,
    reconcile_keys,
    record,
    release,
    unknown,
)
from tests.store.support import StoreFactory, claim, claim_result, events, raw, snapshot

WORKERS = ("w2", "w3", "w4")


def poll(store: Store, rounds: int, clock: ManualClock, step: float) -> list[Outcome]:
    """Several workers poll (ClaimNext and a direct Claim of t1) while time passes."""
    answers: list[Outcome] = []
    for _ in range(rounds):
        for w in WORKERS:
            answers.append(
                store.claims.claim_next("default", principal=w, epoch=1, ttl=30).verdict.outcome
            )
            answers.append(claim_result(store, "t1", principal=w).verdict.outcome)
        clock.advance(step)
    return answers


def test_unknown_opens_a_reconciliation_in_the_same_txn(
    make_store: StoreFactory, clock: ManualClock, etcd_client: Any
) -> None:
    store = make_store(limits=limits())
    opened_at = clock.now()
    fence, eid = unknown(store)
    effect = store.effects.get(eid)
    assert (effect.state, effect.reconcile_open) == (EffectState.UNKNOWN, True)
    assert (effect.reconcile_owner, effect.reconcile_owner_attempt_id) == ("w1", fence.attempt_id)
    assert (effect.reconcile_opened_at, effect.reconcile_deadline) == (
        opened_at,
        opened_at + TIMEOUT,
    )
    assert (effect.reconcile_escalation, effect.reconcile_named) == ("NEEDS_APPROVAL", False)
    key = store.ctx.keys.reconcile("t1", eid)
    assert reconcile_keys(store, etcd_client) == [key]
    # Written by the very txn that recorded UNKNOWN.
    assert raw(etcd_client, key).mod_revision == effect.mod_revision
    value, _ = etcd_client.get(key)
    assert decode(Reconciliation, value) == Reconciliation.of(effect)

    # A repeated UNKNOWN later writes nothing and does not move the deadline.
    clock.advance(30)
    before = snapshot(store, etcd_client)
    assert record(store, fence, eid, EffectState.UNKNOWN).verdict.outcome is Outcome.OK
    assert snapshot(store, etcd_client) == before


@pytest.mark.parametrize(("handoffs", "owner"), [(0, ""), (1, "reconciler-bot")])
def test_past_the_deadline_it_escalates_and_nobody_was_handed_the_task_in_between(
    make_store: StoreFactory,
    clock: ManualClock,
    etcd_client: Any,
    handoffs: int,
    owner: str,
) -> None:
    store = make_store(limits=limits(handoffs=handoffs))
    fence, eid = unknown(store, owner=owner)
    release(store, fence)
    sweeper_before = escalations(store, "sweeper")

    # Three workers poll through the reconcile window: not one claim. ClaimNext skips the
    # task (NO_READY_TASK), a direct Claim is told RECONCILING.
    answers = poll(store, rounds=10, clock=clock, step=5)
    assert answers.count(Outcome.NO_READY_TASK) == answers.count(Outcome.RECONCILING) == 30
    clock.advance(TIMEOUT - 50 - 1)
    assert store.reconcile.sweep() == 0  # not due yet
    assert store.tasks.get("t1").state is TaskState.READY

    clock.advance(1)
    assert store.reconcile.sweep() == 1
    task = store.tasks.get("t1")
    assert task.state is TaskState.NEEDS_APPROVAL
    assert len(ops_of(store, etcd_client, "t1", Op.CLAIM)) == 1  # w1's, before UNKNOWN
    (escalated,) = ops_of(store, etcd_client, "t1", Op.ESCALATE_RECONCILE)
    assert (escalated.from_state, escalated.to_state, escalated.by) == (
        TaskState.READY,
        TaskState.NEEDS_APPROVAL,
        SWEEPER,
    )
    assert eid in escalated.detail and "deadline" in escalated.detail
    assert escalations(store, "sweeper") - sweeper_before == 1
    effect = store.effects.get(eid)
    assert (effect.state, effect.reconcile_open) == (EffectState.UNKNOWN, False)
    assert effect.reconcile_escalated_at == clock.now()
    assert reconcile_keys(store, etcd_client) == []
    assert store.effects.count_open() == 1  # still uncertain: DrainStatus keeps counting it

    # A human decides; then the task is claimable again and the effect is sent with its key.
    assert claim_result(store, "t1", principal="w2").verdict.outcome is Outcome.NOT_CLAIMABLE
    store.effects.approve_retry("t1", by="ops", resolution=EffectState.ABSENT, reason="no mail")
    again = claim(store, "t1", principal="w2")
    assert prepare(store, again, principal="w2").action is EffectAction.EXECUTE


def test_the_default_owner_allows_exactly_one_takeover(
    make_store: StoreFactory, clock: ManualClock, etcd_client: Any
) -> None:
    store = make_store(limits=limits(handoffs=1))
    fence, _ = unknown(store)
    release(store, fence)
    # One takeover reconciles (looks the key up downstream, never sends) ...
    takeover = claim(store, "t1", principal="w2")
    reconcile = prepare(store, takeover, principal="w2")
    assert (reconcile.verdict.outcome, reconcile.action) == (Outcome.OK, EffectAction.RECONCILE)
    # ... but leaves without an answer: from now on nobody is handed the task.
    release(store, takeover, principal="w2")
    answers = poll(store, rounds=5, clock=clock, step=10)
    assert set(answers) == {Outcome.NO_READY_TASK, Outcome.RECONCILING}
    assert len(ops_of(store, etcd_client, "t1", Op.CLAIM)) == 2
    clock.advance(TIMEOUT - 50)
    assert store.reconcile.sweep() == 1
    assert store.tasks.get("t1").state is TaskState.NEEDS_APPROVAL


def test_a_resolution_before_the_deadline_closes_it_and_nothing_escalates(
    make_store: StoreFactory, clock: ManualClock, etcd_client: Any
) -> None:
    store = make_store(limits=limits(handoffs=0))
    fence, eid = unknown(store)
    # The holder reconciles while it holds the claim: RECONCILE, lookup, ABSENT.
    assert prepare(store, fence).action is EffectAction.RECONCILE
    closed = record(store, fence, eid, EffectState.ABSENT)
    assert closed.effect is not None and closed.effect.reconcile_open is False
    assert reconcile_keys(store, etcd_client) == []
    release(store, fence)

    before = (escalations(store, "sweeper"), escalations(store, "claim"))
    clock.advance(TIMEOUT * 2)
    assert store.reconcile.sweep() == 0
    assert ops_of(store, etcd_client, "t1", Op.ESCALATE_RECONCILE) == []
    assert (escalations(store, "sweeper"), escalations(store, "claim")) == before
    # Claimable as usual; the next holder sends with the same key.
    nxt = store.claims.claim_next("default", principal="w2", epoch=1, ttl=30)
    assert nxt.verdict.outcome is Outcome.CLAIMED and nxt.fence is not None
    assert prepare(store, nxt.fence, principal="w2").action is EffectAction.EXECUTE


def test_the_owner_resolves_after_its_claim_ended_and_the_task_is_handed_out_again(
    make_store: StoreFactory, etcd_client: Any
) -> None:
    store = make_store(limits=limits(handoffs=0))
    fence, eid = unknown(store)
    release(store, fence)
    skipped = store.claims.claim_next("default", principal="w2", epoch=1, ttl=30)
    assert skipped.verdict.outcome is Outcome.NO_READY_TASK

    before = snapshot(store, etcd_client)
    with pytest.raises(PermissionDenied, match="'w1'"):
        store.reconcile.resolve(
            eid,
            caller="w2",
            is_admin=False,
            resolution=EffectState.ABSENT,
            external_ref="",
            etag="",
            reason="",
        )
    assert snapshot(store, etcd_client) == before

    resolved = store.reconcile.resolve(
        eid,
        caller="w1",
        is_admin=False,
        resolution=EffectState.ABSENT,
        external_ref="",
        etag="",
        reason="lookup: no such message",
    )
    assert (resolved.state, resolved.reconcile_open) == (EffectState.ABSENT, False)
    assert reconcile_keys(store, etcd_client) == []
    assert store.effects.count_open() == 0
    # ClaimNext skipped the task while it waited; its ready key came back with the resolution.
    nxt = store.claims.claim_next("default", principal="w2", epoch=1, ttl=30)
    assert nxt.verdict.outcome is Outcome.CLAIMED and nxt.fence is not None
    assert prepare(store, nxt.fence, principal="w2").action is EffectAction.EXECUTE


def test_a_named_principal_resolves_and_the_holder_may_not(
    make_store: StoreFactory, etcd_client: Any
) -> None:
    store = make_store(limits=limits(handoffs=3))
    fence, eid = unknown(store, owner="reconciler-bot")
    assert store.effects.get(eid).reconcile_named is True
    release(store, fence)
    # A named owner allows no takeover, whatever reconcile_handoffs says.
    assert claim_result(store, "t1", principal="w2").verdict.outcome is Outcome.RECONCILING
    with pytest.raises(PermissionDenied):
        store.reconcile.resolve(
            eid,
            caller="w1",
            is_admin=False,
            resolution=EffectState.ABSENT,
            external_ref="",
            etag="",
            reason="",
        )
    done = store.reconcile.resolve(
        eid,
        caller="reconciler-bot",
        is_admin=False,
        resolution=EffectState.COMMITTED,
        external_ref="msg-7",
        etag="",
        reason="found in the mail log",
    )
    assert (done.state, done.external_ref) == (EffectState.COMMITTED, "msg-7")
    nxt = claim(store, "t1", principal="w2")
    skip = prepare(store, nxt, principal="w2")
    assert skip.action is EffectAction.SKIP
    assert skip.effect is not None and skip.effect.external_ref == "msg-7"


def test_the_owner_of_an_open_reconciliation_cannot_be_renamed(
    make_store: StoreFactory, etcd_client: Any
) -> None:
    store = make_store(limits=limits())
    fence, eid = unknown(store)
    before = snapshot(store, etcd_client)
    with pytest.raises(FailedPrecondition, match="owned by 'w1'"):
        record(store, fence, eid, EffectState.UNKNOWN, owner="reconciler-bot")
    assert snapshot(store, etcd_client) == before
    # Naming the owner it already has is a plain repeat.
    assert record(store, fence, eid, EffectState.UNKNOWN, owner="w1").verdict.accepted


def test_resolve_is_refused_while_a_claim_is_alive(
    make_store: StoreFactory, etcd_client: Any
) -> None:
    store = make_store(limits=limits())
    _, eid = unknown(store)
    before = snapshot(store, etcd_client)
    with pytest.raises(FailedPrecondition, match="live claim"):
        store.reconcile.resolve(
            eid,
            caller="ops",
            is_admin=True,
            resolution=EffectState.ABSENT,
            external_ref="",
            etag="",
            reason="",
        )
    assert snapshot(store, etcd_client) == before


def test_a_claim_past_the_deadline_escalates_it_itself(
    make_store: StoreFactory, clock: ManualClock, etcd_client: Any
) -> None:
    store = make_store(limits=limits(handoffs=1))
    fence, eid = unknown(store)
    release(store, fence)
    before = escalations(store, "claim")
    clock.advance(TIMEOUT)
    refused = claim_result(store, "t1", principal="w2")
    assert refused.verdict.outcome is Outcome.NEEDS_APPROVAL and refused.fence is None
    assert eid in refused.verdict.message
    assert store.tasks.get("t1").state is TaskState.NEEDS_APPROVAL
    (escalated,) = ops_of(store, etcd_client, "t1", Op.ESCALATE_RECONCILE)
    assert escalated.by == "w2"
    assert escalations(store, "claim") - before == 1
    assert len(ops_of(store, etcd_client, "t1", Op.CLAIM)) == 1


def test_a_live_holder_keeps_its_claim_past_the_deadline_then_it_escalates(
    make_store: StoreFactory, clock: ManualClock, etcd_client: Any
) -> None:
    store = make_store(limits=limits())
    fence, _ = unknown(store)
    clock.advance(TIMEOUT + 1)
    assert store.reconcile.sweep() == 0
    assert store.tasks.get("t1").state is TaskState.CLAIMED
    release(store, fence)
    assert store.reconcile.sweep() == 1
    (escalated,) = ops_of(store, etcd_client, "t1", Op.ESCALATE_RECONCILE)
    assert escalated.from_state is TaskState.READY


def test_an_expired_holder_is_escalated_from_claimed_and_its_attempt_closed(
    make_store: StoreFactory, clock: ManualClock, etcd_client: Any
) -> None:
    store = make_store(limits=limits(), reclaim=False)  # no reclaimer: the task stays CLAIMED
    new_fence, _ = unknown(store)
    etcd_client.revoke_lease(store.tasks.get("t1").lease_id)
    clock.advance(TIMEOUT)
    assert store.reconcile.sweep() == 1
    (escalated,) = ops_of(store, etcd_client, "t1", Op.ESCALATE_RECONCILE)
    assert (escalated.from_state, escalated.to_state) == (
        TaskState.CLAIMED,
        TaskState.NEEDS_APPROVAL,
    )
    (attempt,) = store.tasks.attempts("t1")
    assert attempt.attempt_id == new_fence.attempt_id and attempt.ended_at == clock.now()
    keys = store.ctx.keys
    assert raw(etcd_client, keys.claimed("t1")) is None


def test_a_cancelled_tasks_uncertain_effect_can_be_resolved_by_an_admin(
    make_store: StoreFactory, clock: ManualClock, etcd_client: Any
) -> None:
    store = make_store(limits=limits())
    _, eid = unknown(store)
    store.tasks.cancel("t1", by="pm", reason="not needed")
    assert store.effects.count_open() == 1
    # At the deadline the reconciliation of a cancelled task closes without a transition ...
    clock.advance(TIMEOUT)
    before = escalations(store, "sweeper")
    assert store.reconcile.sweep() == 1
    assert store.tasks.get("t1").state is TaskState.CANCELLED
    assert ops_of(store, etcd_client, "t1", Op.ESCALATE_RECONCILE) == []
    assert escalations(store, "sweeper") == before
    assert reconcile_keys(store, etcd_client) == []
    # ... and an admin settles the effect, so DrainStatus stops counting it.
    assert store.effects.count_open() == 1
    store.reconcile.resolve(
        eid,
        caller="ops",
        is_admin=True,
        resolution=EffectState.ABSENT,
        external_ref="",
        etag="",
        reason="cancelled; the mail log shows nothing",
    )
    assert store.effects.count_open() == 0


def test_a_new_revision_is_not_held_up_by_the_old_revisions_reconciliation(
    make_store: StoreFactory, clock: ManualClock, etcd_client: Any
) -> None:
    store = make_store(limits=limits(handoffs=0))
    fence, eid = unknown(store, owner="reconciler-bot")
    release(store, fence)
    assert claim_result(store, "t1", principal="w2").verdict.outcome is Outcome.RECONCILING
    store.tasks.update_input(
        "t1", data=b"new input", input_digest=digest_of(b"new input"), expected_revision=1, by="pm"
    )
    # Revision 2 is new business input: claimable at once, its effects are new effects.
    fresh = claim(store, "t1", principal="w2")
    assert prepare(store, fresh, principal="w2").action is EffectAction.EXECUTE
    release(store, fresh, principal="w2")
    # The old effect is still reconciled: at its deadline it closes, the task stays READY.
    before = escalations(store, "sweeper")
    clock.advance(TIMEOUT)
    assert store.reconcile.sweep() == 1
    assert store.tasks.get("t1").state is TaskState.READY
    assert ops_of(store, etcd_client, "t1", Op.ESCALATE_RECONCILE) == []
    assert escalations(store, "sweeper") == before
    old = store.effects.get(eid)
    assert (old.state, old.reconcile_open) == (EffectState.UNKNOWN, False)
    assert old.reconcile_escalated_at == clock.now()
    assert reconcile_keys(store, etcd_client) == []


def test_two_replicas_sweeping_at_once_escalate_each_task_exactly_once(
    make_store: StoreFactory, clock: ManualClock, etcd_client: Any
) -> None:
    one = make_store(limits=limits())
    two = make_store(limits=limits())
    ids = [f"t{n}" for n in range(8)]
    for task_id in ids:
        fence, _ = unknown(one, task_id)
        release(one, fence)
    before = escalations(one, "sweeper")
    clock.advance(TIMEOUT)
    barrier = threading.Barrier(2)
    done: dict[str, int] = {}

    def sweep(name: str, store: Store) -> None:
        barrier.wait()
        done[name] = store.reconcile.sweep()

    threads = [threading.Thread(target=sweep, args=(n, s)) for n, s in (("1", one), ("2", two))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert sum(done.values()) == len(ids)
    for task_id in ids:
        assert one.tasks.get(task_id).state is TaskState.NEEDS_APPROVAL
        assert len(ops_of(one, etcd_client, task_id, Op.ESCALATE_RECONCILE)) == 1
        assert [e.op for e in events(one, etcd_client, task_id)].count(Op.CLAIM) == 1
    assert escalations(one, "sweeper") - before == len(ids)
    assert reconcile_keys(one, etcd_client) == []


def test_the_running_sweepers_of_two_replicas_escalate_once_and_only_once(
    make_store: StoreFactory, clock: ManualClock, etcd_client: Any
) -> None:
    replicas = [make_store(limits=limits(), scan_interval=0.05) for _ in range(2)]
    sweeps = [0, 0]

    def counted(n: int, sweep: Callable[[], int]) -> Callable[[], int]:
        def run() -> int:
            found = sweep()
            sweeps[n] += 1
            return found

        return run

    for n, replica in enumerate(replicas):
        replica.reconcile.sweep = counted(n, replica.reconcile.sweep)  # type: ignore[method-assign]
    ids = ["t1", "t2", "t3"]
    for task_id in ids:
        fence, _ = unknown(replicas[0], task_id)
        release(replicas[0], fence)
    before = escalations(replicas[0], "sweeper")
    clock.advance(TIMEOUT)
    eventually(
        lambda: all(replicas[1].tasks.get(t).state is TaskState.NEEDS_APPROVAL for t in ids),
        timeout=10,
        message="the sweepers never escalated",
    )
    seen = list(sweeps)
    # Both sweepers keep running past the escalation: still exactly one per task.
    eventually(lambda: all(s >= s0 + 3 for s, s0 in zip(sweeps, seen, strict=True)), timeout=10)
    for task_id in ids:
        assert len(ops_of(replicas[0], etcd_client, task_id, Op.ESCALATE_RECONCILE)) == 1
    assert escalations(replicas[0], "sweeper") - before == len(ids)
