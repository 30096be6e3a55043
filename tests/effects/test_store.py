"""Effects in the store, against a real etcd: prepare/record txns, ids across attempts and
revisions, fencing of a late owner, and the NEEDS_APPROVAL hold of non-replayable tasks."""

from __future__ import annotations

from typing import Any

import pytest

from coordinator.domain.decisions import Fence
from coordinator.domain.digests import digest_of
from coordinator.domain.effect_ids import effect_id_of, legacy_effect_id
from coordinator.domain.effects import EffectAction, EffectState
from coordinator.domain.states import AttemptEnd, FenceReason, Op, Outcome, TaskState
from coordinator.errors import FailedPrecondition, InvalidArgument, NotFound, ResourceExhausted
from coordinator.store import Store, TaskSpec
from coordinator.store.effects import effect as effect_module
from coordinator.store.effects.effect import PrepareResult, RecordResult
from tests.helpers import eventually
from tests.store.support import (
    StoreFactory,
    claim,
    claim_result,
    events,
    raw,
    snapshot,
    wait_claim_gone,
)

X, Y = digest_of(b"payload X"), digest_of(b"payload Y")


@pytest.fixture
def store(make_store: StoreFactory) -> Store:
    """A started store on this test's prefix (the effects conftest also serves a server store)."""
    return make_store()


def new_task(store: Store, task_id: str = "t1", *, non_replayable: bool = False) -> None:
    spec = TaskSpec(task_id=task_id, input=b"input", non_replayable=non_replayable)
    store.tasks.create(spec, by="pm")


def prepare(
    store: Store, fence: Fence, digest: str = X, *, principal: str = "w1", slot: str = "email"
) -> PrepareResult:
    return store.effects.prepare(
        fence, principal=principal, node_id="notify", effect_slot=slot, payload_digest=digest
    )


def record(
    store: Store,
    fence: Fence,
    eid: str,
    state: EffectState,
    *,
    principal: str = "w1",
    ref: str = "",
) -> RecordResult:
    return store.effects.record(
        fence, principal=principal, effect_id=eid, state=state, external_ref=ref, etag=""
    )


def open_keys(store: Store, etcd_client: Any) -> list[str]:
    prefix = store.ctx.keys.open_effects_prefix()
    return sorted(meta.key.decode() for _, meta in etcd_client.get_prefix(prefix))


def test_a_first_prepare_writes_prepared_and_indexes_it_as_open(
    store: Store, etcd_client: Any
) -> None:
    new_task(store)
    fence = claim(store, "t1")
    result = prepare(store, fence)
    assert (result.verdict.outcome, result.action) == (Outcome.OK, EffectAction.EXECUTE)
    assert result.effect is not None
    eid = result.effect.effect_id
    assert eid == effect_id_of(store.tasks.get("t1"), 1, "notify", "email")
    stored = store.effects.get(eid)
    assert (stored.state, stored.payload_digest) == (EffectState.PREPARED, X)
    assert (stored.prepared_generation, stored.prepared_attempt_id) == (
        fence.claim_generation,
        fence.attempt_id,
    )
    assert stored.mod_revision == result.effect.mod_revision
    assert open_keys(store, etcd_client) == [store.ctx.keys.open_effect("t1", eid)]
    assert store.effects.count_open() == 1

    # A retry of the same prepare by the same attempt: EXECUTE again, and nothing written.
    before = snapshot(store, etcd_client)
    again = prepare(store, fence)
    assert (again.verdict.outcome, again.action) == (Outcome.OK, EffectAction.EXECUTE)
    assert snapshot(store, etcd_client) == before

    done = record(store, fence, eid, EffectState.COMMITTED, ref="msg-1")
    assert done.verdict.outcome is Outcome.OK
    assert done.effect is not None and done.effect.state is EffectState.COMMITTED
    assert open_keys(store, etcd_client) == []
    assert store.effects.count_open() == 0


def test_the_effect_id_is_stable_across_attempts_and_new_for_a_new_revision(
    store: Store,
) -> None:
    new_task(store)
    first = claim(store, "t1", principal="w1")
    eid = prepare(store, first).effect.effect_id  # type: ignore[union-attr]
    assert store.acceptance.release(first, principal="w1", reason="").outcome is Outcome.OK

    second = claim(store, "t1", principal="w2")
    assert second.claim_generation > first.claim_generation
    again = prepare(store, second, principal="w2")
    assert again.effect is not None and again.effect.effect_id == eid
    assert again.action is EffectAction.RECONCILE  # left PREPARED by attempt 1
    assert store.acceptance.release(second, principal="w2", reason="").outcome is Outcome.OK

    store.tasks.update_input("t1", data=b"new input", input_digest="", expected_revision=1, by="pm")
    third = claim(store, "t1", principal="w3")
    fresh = prepare(store, third, principal="w3")
    assert fresh.effect is not None
    assert fresh.effect.effect_id == effect_id_of(store.tasks.get("t1"), 2, "notify", "email")
    assert fresh.effect.effect_id != eid
    assert (fresh.action, fresh.effect.task_revision) == (EffectAction.EXECUTE, 2)
    # Another slot of the same revision is another effect too.
    other = prepare(store, third, principal="w3", slot="email-2")
    assert other.effect is not None and other.effect.effect_id not in (eid, fresh.effect.effect_id)


def test_a_committed_slot_is_skipped_with_its_external_ref(store: Store) -> None:
    new_task(store)
    first = claim(store, "t1", principal="w1")
    eid = prepare(store, first).effect.effect_id  # type: ignore[union-attr]
    record(store, first, eid, EffectState.COMMITTED, ref="msg-9")
    store.acceptance.release(first, principal="w1", reason="")

    second = claim(store, "t1", principal="w2")
    skip = prepare(store, second, principal="w2")
    assert (skip.verdict.outcome, skip.action) == (Outcome.OK, EffectAction.SKIP)
    assert skip.effect is not None and skip.effect.external_ref == "msg-9"
    conflict = prepare(store, second, Y, principal="w2")
    assert (conflict.verdict.outcome, conflict.action) == (
        Outcome.PAYLOAD_CONFLICT,
        EffectAction.SKIP,
    )
    assert conflict.effect is not None and conflict.effect.payload_digest == X


def test_a_takeover_with_another_payload_gets_the_original_digest_and_may_reconcile(
    store: Store, etcd_client: Any
) -> None:
    new_task(store)
    first = claim(store, "t1", principal="w1")
    eid = prepare(store, first).effect.effect_id  # type: ignore[union-attr]
    store.acceptance.release(first, principal="w1", reason="")
    second = claim(store, "t1", principal="w2")

    conflict = prepare(store, second, Y, principal="w2")
    assert conflict.verdict.outcome is Outcome.PAYLOAD_CONFLICT
    assert conflict.action is EffectAction.RECONCILE
    assert conflict.effect is not None and conflict.effect.payload_digest == X
    assert conflict.effect.reconciler_generation == second.claim_generation
    # The reconciler records what it found; the slot stays bound to X.
    found = record(store, second, eid, EffectState.COMMITTED, principal="w2", ref="msg-1")
    assert found.effect is not None
    assert (found.effect.state, found.effect.payload_digest) == (EffectState.COMMITTED, X)
    assert found.effect.recorded_generation == second.claim_generation
    assert open_keys(store, etcd_client) == []


def test_an_absent_effect_is_prepared_again_by_the_new_holder(store: Store) -> None:
    new_task(store)
    first = claim(store, "t1", principal="w1")
    eid = prepare(store, first).effect.effect_id  # type: ignore[union-attr]
    record(store, first, eid, EffectState.UNKNOWN)
    store.acceptance.release(first, principal="w1", reason="")
    second = claim(store, "t1", principal="w2")
    assert prepare(store, second, principal="w2").action is EffectAction.RECONCILE
    assert record(store, second, eid, EffectState.ABSENT, principal="w2").verdict.accepted
    again = prepare(store, second, principal="w2")
    assert again.action is EffectAction.EXECUTE
    assert again.effect is not None and again.effect.state is EffectState.PREPARED
    assert again.effect.prepared_generation == second.claim_generation
    assert store.effects.count_open() == 1


def test_a_late_owner_is_fenced_at_prepare_and_record_and_writes_nothing(
    store: Store, etcd_client: Any
) -> None:
    new_task(store)
    late = claim(store, "t1", principal="w1", ttl=1)
    eid = prepare(store, late).effect.effect_id  # type: ignore[union-attr]
    wait_claim_gone(store, etcd_client, "t1")
    current = claim(store, "t1", principal="w2")

    before = snapshot(store, etcd_client)
    for result in (
        prepare(store, late).verdict,
        prepare(store, late, Y).verdict,
        record(store, late, eid, EffectState.COMMITTED, ref="msg-1").verdict,
        record(store, late, eid, EffectState.UNKNOWN).verdict,
    ):
        assert (result.outcome, result.reason) == (Outcome.FENCED, FenceReason.SUPERSEDED)
    assert snapshot(store, etcd_client) == before
    assert prepare(store, current, principal="w2").action is EffectAction.RECONCILE


def test_a_cancelled_task_refuses_prepare(store: Store) -> None:
    new_task(store)
    fence = claim(store, "t1")
    store.tasks.cancel("t1", by="pm", reason="")
    assert prepare(store, fence).verdict.outcome is Outcome.CANCELLED


def test_bad_records_raise_and_write_nothing(store: Store, etcd_client: Any) -> None:
    new_task(store)
    new_task(store, "t2")
    fence = claim(store, "t1")
    other = claim(store, "t2")
    eid = prepare(store, fence).effect.effect_id  # type: ignore[union-attr]
    record(store, fence, eid, EffectState.COMMITTED, ref="msg-1")
    before = snapshot(store, etcd_client)
    never = legacy_effect_id("t1", 1, "notify", "never-prepared")
    with pytest.raises(NotFound, match="never prepared"):
        record(store, fence, never, EffectState.COMMITTED)
    with pytest.raises(InvalidArgument, match="belongs to task 't1'"):
        record(store, other, eid, EffectState.COMMITTED, ref="msg-1")
    with pytest.raises(FailedPrecondition, match="is COMMITTED"):
        record(store, fence, eid, EffectState.ABSENT)
    with pytest.raises(NotFound):
        store.effects.get(never)
    assert snapshot(store, etcd_client) == before
    # A repeat of the record that landed is OK again (a retry after a lost response).
    again = record(store, fence, eid, EffectState.COMMITTED, ref="msg-1")
    assert again.verdict.outcome is Outcome.OK
    assert snapshot(store, etcd_client) == before


# --- non-replayable tasks ---------------------------------------------------------------------


def test_a_non_replayable_task_with_an_uncertain_effect_waits_for_approval(
    store: Store, etcd_client: Any
) -> None:
    new_task(store, non_replayable=True)
    first = claim(store, "t1", principal="w1")
    eid = prepare(store, first).effect.effect_id  # type: ignore[union-attr]
    record(store, first, eid, EffectState.UNKNOWN)
    store.acceptance.release(first, principal="w1", reason="the send timed out")

    refused = claim_result(store, "t1", principal="w2")
    assert refused.verdict.outcome is Outcome.NEEDS_APPROVAL
    assert refused.fence is None and eid in refused.verdict.message
    task = store.tasks.get("t1")
    assert task.state is TaskState.NEEDS_APPROVAL
    assert list(etcd_client.get_prefix(store.ctx.keys.ready_prefix())) == []
    # The local index is a watch-fed hint: the release's put of the ready key may still be on
    # its way after the gate discarded it; the deletion that follows settles it.
    eventually(lambda: not store.ready.first("default", 8), timeout=5)
    after = store.claims.claim_next("default", principal="w2", epoch=1, ttl=30)
    assert after.verdict.outcome is Outcome.NO_READY_TASK
    assert claim_result(store, "t1").verdict.outcome is Outcome.NOT_CLAIMABLE
    hold = events(store, etcd_client, "t1")[-1]
    assert (hold.op, hold.from_state, hold.to_state, hold.by) == (
        Op.HOLD_FOR_APPROVAL,
        TaskState.READY,
        TaskState.NEEDS_APPROVAL,
        "w2",
    )

    ready, resolved = store.effects.approve_retry(
        "t1", by="ops-anna", resolution=EffectState.ABSENT, reason="no mail in the log"
    )
    assert ready.state is TaskState.READY
    assert [(e.effect_id, e.state) for e in resolved] == [(eid, EffectState.ABSENT)]
    assert store.effects.get(eid).detail.startswith("resolved ABSENT by ops-anna")
    approval = events(store, etcd_client, "t1")[-1]
    assert (approval.op, approval.to_state, approval.by) == (
        Op.APPROVE_RETRY,
        TaskState.READY,
        "ops-anna",
    )
    assert "ops-anna" in approval.detail and eid in approval.detail
    assert store.effects.count_open() == 0

    third = claim(store, "t1", principal="w3")
    again = prepare(store, third, principal="w3")
    assert again.action is EffectAction.EXECUTE  # approved: send with the same key


def test_the_hold_also_applies_over_an_expired_claim(
    make_store: StoreFactory, etcd_client: Any
) -> None:
    store = make_store(reclaim=False)  # a direct claim of the expired task, never reclaimed
    new_task(store, non_replayable=True)
    first = claim(store, "t1", principal="w1", ttl=1)
    prepare(store, first)  # and then the worker dies: PREPARED forever
    wait_claim_gone(store, etcd_client, "t1")
    assert store.tasks.get("t1").state is TaskState.CLAIMED
    refused = claim_result(store, "t1", principal="w2")
    assert refused.verdict.outcome is Outcome.NEEDS_APPROVAL
    task = store.tasks.get("t1")
    assert task.state is TaskState.NEEDS_APPROVAL
    hold = events(store, etcd_client, "t1")[-1]
    assert (hold.op, hold.from_state) == (Op.HOLD_FOR_APPROVAL, TaskState.CLAIMED)
    assert raw(etcd_client, store.ctx.keys.claimed("t1")) is None
    attempt = store.tasks.attempts("t1")[0]
    assert attempt.end is AttemptEnd.EXPIRED

    cancelled = store.tasks.cancel("t1", by="pm", reason="give up")
    assert cancelled.state is TaskState.CANCELLED


def test_a_replayable_task_is_claimable_over_an_uncertain_effect(store: Store) -> None:
    new_task(store)
    first = claim(store, "t1", principal="w1")
    prepare(store, first)
    store.acceptance.release(first, principal="w1", reason="")
    assert claim_result(store, "t1", principal="w2").verdict.outcome is Outcome.CLAIMED


def test_approve_retry_needs_a_task_waiting_for_approval(store: Store) -> None:
    new_task(store)
    with pytest.raises(FailedPrecondition, match="only a NEEDS_APPROVAL task"):
        store.effects.approve_retry("t1", by="ops", resolution=EffectState.ABSENT, reason="")
    with pytest.raises(NotFound):
        store.effects.approve_retry("nope", by="ops", resolution=EffectState.ABSENT, reason="")


def test_a_task_holds_a_bounded_number_of_effect_slots(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One claim bound 1,500 slots (12 MB of etcd, uncharged) in 16 s: a new slot past the
    bound is refused, writing nothing; a slot already bound still answers."""
    monkeypatch.setattr(effect_module, "MAX_EFFECTS_PER_TASK", 3)
    new_task(store)
    fence = claim(store, "t1")
    for slot in ("a", "b", "c"):
        assert prepare(store, fence, slot=slot).action is EffectAction.EXECUTE
    with pytest.raises(ResourceExhausted) as refused:
        prepare(store, fence, slot="d")
    assert str(refused.value) == (
        "task 't1' holds 3 effect slots, the limit: a new slot cannot be bound; reuse a slot "
        "for a retry of the same effect"
    )
    assert len(store.effects.list_all(task_id="t1", page_size=10)[0]) == 3
    assert prepare(store, fence, slot="a").action is EffectAction.EXECUTE  # still PREPARED
