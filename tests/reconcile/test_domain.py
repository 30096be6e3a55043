"""coordinator.domain.reconcile: opening, the claim gate, escalation, who may resolve (pure)."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from coordinator.domain.effect_ids import effect_id
from coordinator.domain.effects import EffectRecord, EffectState, decide_record
from coordinator.domain.reconcile import (
    ESCALATION,
    Gate,
    Reconciliation,
    check_reconcile_principal,
    check_resolver,
    decide_claim_gate,
    escalate,
    escalation_detail,
    open_on_unknown,
    resolve_owned,
)
from coordinator.domain.states import Op, Outcome, TaskState, is_legal, next_state
from coordinator.errors import FailedPrecondition, InvalidArgument, PermissionDenied

NOW = 1_000.0
TIMEOUT = 600.0
EID = effect_id("t1", 1, 1, "notify", "email")


def prepared(**changes: object) -> EffectRecord:
    base = EffectRecord(
        effect_id=EID,
        task_id="t1",
        task_revision=1,
        node_id="notify",
        effect_slot="email",
        payload_digest="sha256:" + "a" * 64,
        state=EffectState.PREPARED,
        prepared_generation=10,
        prepared_attempt_id="a1-x",
        prepared_by="w1",
        prepared_at=NOW - 5,
    )
    return replace(base, **changes)  # type: ignore[arg-type]


def opened(named: str = "") -> EffectRecord:
    unknown = decide_record(
        prepared(),
        state=EffectState.UNKNOWN,
        external_ref="",
        etag="",
        generation=10,
        principal="w1",
        now=NOW,
    )
    assert unknown is not None
    return open_on_unknown(
        prepared(),
        unknown,
        holder="w1",
        attempt_id="a1-x",
        attempt=1,
        named_owner=named,
        now=NOW,
        timeout=TIMEOUT,
    )


def rec(
    *, named: bool = False, attempt: int = 1, deadline: float = NOW + TIMEOUT
) -> Reconciliation:
    return replace(
        Reconciliation.of(opened("bot" if named else "")), deadline=deadline, opened_attempt=attempt
    )


# --- opening ---------------------------------------------------------------------------------


def test_prepared_to_unknown_opens_a_reconciliation_owned_by_the_holder() -> None:
    effect = opened()
    assert effect.state is EffectState.UNKNOWN
    assert (effect.reconcile_owner, effect.reconcile_owner_attempt_id) == ("w1", "a1-x")
    assert effect.reconcile_named is False
    assert (effect.reconcile_opened_at, effect.reconcile_deadline) == (NOW, NOW + TIMEOUT)
    assert (effect.reconcile_escalation, effect.reconcile_open) == (ESCALATION, True)
    assert effect.reconcile_opened_attempt == 1
    assert Reconciliation.of(effect) == Reconciliation(
        effect_id=EID,
        task_id="t1",
        task_revision=1,
        owner="w1",
        owner_attempt_id="a1-x",
        named=False,
        opened_attempt=1,
        opened_at=NOW,
        deadline=NOW + TIMEOUT,
        escalation="NEEDS_APPROVAL",
    )


def test_a_named_principal_owns_it() -> None:
    effect = opened("reconciler-bot")
    assert (effect.reconcile_owner, effect.reconcile_named) == ("reconciler-bot", True)


@pytest.mark.parametrize("state", [EffectState.COMMITTED, EffectState.ABSENT])
def test_other_records_open_nothing(state: EffectState) -> None:
    after = decide_record(
        prepared(), state=state, external_ref="r", etag="", generation=10, principal="w1", now=NOW
    )
    assert after is not None
    kept = open_on_unknown(
        prepared(),
        after,
        holder="w1",
        attempt_id="a",
        attempt=1,
        named_owner="",
        now=NOW,
        timeout=TIMEOUT,
    )
    assert kept is after and not kept.reconcile_open


def test_a_repeated_unknown_never_extends_the_deadline() -> None:
    effect = opened()
    # The repeat is not written at all (decide_record answers None) ...
    again = decide_record(
        effect,
        state=EffectState.UNKNOWN,
        external_ref="",
        etag="",
        generation=10,
        principal="w1",
        now=NOW + 500,
    )
    assert again is None
    # ... and even an UNKNOWN -> UNKNOWN pass through open_on_unknown keeps the first deadline.
    kept = open_on_unknown(
        effect,
        replace(effect, updated_at=NOW + 500),
        holder="w2",
        attempt_id="a2",
        attempt=2,
        named_owner="",
        now=NOW + 500,
        timeout=TIMEOUT,
    )
    assert (kept.reconcile_owner, kept.reconcile_deadline) == ("w1", NOW + TIMEOUT)


@pytest.mark.parametrize("state", [EffectState.COMMITTED, EffectState.ABSENT])
def test_recording_the_outcome_closes_it(state: EffectState) -> None:
    closed = decide_record(
        opened(),
        state=state,
        external_ref="msg-1",
        etag="",
        generation=10,
        principal="w1",
        now=NOW + 1,
    )
    assert closed is not None and closed.reconcile_open is False
    assert closed.reconcile_escalated_at == 0.0


# --- the claim gate --------------------------------------------------------------------------


def test_no_reconciliation_proceeds() -> None:
    assert decide_claim_gate(3, [], now=NOW, handoffs=1, task_revision=1).gate is Gate.PROCEED


@pytest.mark.parametrize(
    ("task_attempt", "handoffs", "gate"),
    [
        (1, 1, Gate.PROCEED),  # the opener's claim ended: one takeover may reconcile
        (2, 1, Gate.WAIT),  # that takeover was granted (attempt 2) and ended too
        (1, 0, Gate.WAIT),  # strict: no takeover at all
        (2, 2, Gate.PROCEED),
        (3, 2, Gate.WAIT),
    ],
)
def test_default_owner_allows_handoffs_then_waits(
    task_attempt: int, handoffs: int, gate: Gate
) -> None:
    decision = decide_claim_gate(task_attempt, [rec()], now=NOW, handoffs=handoffs, task_revision=1)
    assert decision.gate is gate
    if gate is Gate.WAIT:
        assert decision.verdict is not None
        assert decision.verdict.outcome is Outcome.RECONCILING
        assert EID in decision.verdict.message and "'w1'" in decision.verdict.message


def test_a_named_owner_allows_no_takeover() -> None:
    decision = decide_claim_gate(1, [rec(named=True)], now=NOW, handoffs=5, task_revision=1)
    assert decision.gate is Gate.WAIT
    assert decision.verdict is not None and "'bot'" in decision.verdict.message


def test_another_revisions_reconciliation_never_holds_up_the_task() -> None:
    waiting = rec(named=True)
    due = rec(deadline=NOW - 1)
    for r in (waiting, due):
        assert decide_claim_gate(1, [r], now=NOW, handoffs=0, task_revision=2).gate is (
            Gate.PROCEED
        )


def test_past_the_deadline_escalates_whatever_the_takeovers() -> None:
    due = rec(deadline=NOW)
    later = replace(rec(deadline=NOW + 1), effect_id="eff-" + "b" * 64)
    decision = decide_claim_gate(1, [later, due], now=NOW, handoffs=1, task_revision=1)
    assert (decision.gate, decision.due) == (Gate.ESCALATE, (due,))
    assert decide_claim_gate(
        1, [rec(deadline=NOW + 0.001)], now=NOW, handoffs=1, task_revision=1
    ).gate is (Gate.PROCEED)


@given(
    attempt=st.integers(min_value=1, max_value=50),
    opened_attempt=st.integers(min_value=1, max_value=50),
    handoffs=st.integers(min_value=0, max_value=5),
    named=st.booleans(),
    left=st.floats(min_value=-100, max_value=100, allow_nan=False),
)
def test_the_gate_never_hands_out_more_than_the_allowed_takeovers(
    attempt: int, opened_attempt: int, handoffs: int, named: bool, left: float
) -> None:
    r = replace(rec(named=named), opened_attempt=opened_attempt, deadline=NOW + left)
    decision = decide_claim_gate(attempt, [r], now=NOW, handoffs=handoffs, task_revision=1)
    if NOW + left <= NOW:  # the deadline as stored has passed
        assert decision.gate is Gate.ESCALATE
    elif decision.gate is Gate.PROCEED:
        # A claim goes on only while takeovers remain (none for a named owner).
        assert not named and max(0, attempt - opened_attempt) < handoffs
    else:
        assert decision.gate is Gate.WAIT


# --- escalation and the transition table ------------------------------------------------------


def test_escalate_closes_it_and_keeps_the_effect_unknown() -> None:
    effect = escalate(opened(), NOW + TIMEOUT)
    assert effect.state is EffectState.UNKNOWN and effect.uncertain
    assert (effect.reconcile_open, effect.reconcile_escalated_at) == (False, NOW + TIMEOUT)
    assert "escalated to NEEDS_APPROVAL" in effect.detail
    detail = escalation_detail([opened()])
    assert EID in detail and "'w1'" in detail and "deadline" in detail


@pytest.mark.parametrize("state", [TaskState.READY, TaskState.CLAIMED])
def test_escalation_moves_ready_and_claimed_to_needs_approval(state: TaskState) -> None:
    assert next_state(state, Op.ESCALATE_RECONCILE) is TaskState.NEEDS_APPROVAL


@pytest.mark.parametrize(
    "state",
    [s for s in TaskState if s not in (TaskState.READY, TaskState.CLAIMED)],
)
def test_escalation_is_illegal_from_any_other_state(state: TaskState) -> None:
    assert not is_legal(state, Op.ESCALATE_RECONCILE)


# --- who may resolve --------------------------------------------------------------------------


def test_the_owner_and_an_admin_may_resolve_others_may_not() -> None:
    effect = opened()
    check_resolver(effect, caller="w1", is_admin=False)
    check_resolver(effect, caller="ops", is_admin=True)
    with pytest.raises(PermissionDenied, match="'w1'"):
        check_resolver(effect, caller="w2", is_admin=False)
    # Once escalated, only an admin decides.
    with pytest.raises(PermissionDenied, match="none is open"):
        check_resolver(escalate(effect, NOW), caller="w1", is_admin=False)
    check_resolver(escalate(effect, NOW), caller="ops", is_admin=True)
    # An admin may resolve a PREPARED effect nobody reconciles (a cancelled task's, say).
    check_resolver(prepared(), caller="ops", is_admin=True)


def test_a_settled_effect_cannot_be_resolved() -> None:
    done = replace(opened(), state=EffectState.COMMITTED, reconcile_open=False)
    with pytest.raises(FailedPrecondition, match="COMMITTED"):
        check_resolver(done, caller="ops", is_admin=True)


def test_resolve_owned_closes_and_keeps_the_ref() -> None:
    committed = resolve_owned(
        opened(),
        EffectState.COMMITTED,
        by="w1",
        reason="found it",
        external_ref="msg-9",
        etag="e1",
        now=NOW + 2,
    )
    assert (committed.state, committed.external_ref, committed.etag) == (
        EffectState.COMMITTED,
        "msg-9",
        "e1",
    )
    assert committed.reconcile_open is False and "found it" in committed.detail
    absent = resolve_owned(
        opened(), EffectState.ABSENT, by="ops", reason="", external_ref="", etag="", now=NOW
    )
    assert (absent.state, absent.reconcile_open) == (EffectState.ABSENT, False)


@pytest.mark.parametrize(
    ("value", "state", "message"),
    [
        ("bot", EffectState.COMMITTED, "only with state UNKNOWN"),
        ("x" * 129, EffectState.UNKNOWN, "1-128 characters"),
        (" bot", EffectState.UNKNOWN, "1-128 characters"),
        ("b\not", EffectState.UNKNOWN, "1-128 characters"),
        # Printable, but no caller can have it as its principal, so no one could resolve it.
        ("mail ops", EffectState.UNKNOWN, "1-128 characters"),
        ("..", EffectState.UNKNOWN, "reconcile_principal"),
    ],
)
def test_bad_reconcile_principals_are_refused(value: str, state: EffectState, message: str) -> None:
    with pytest.raises(InvalidArgument, match="reconcile_principal"):
        check_reconcile_principal("reconcile_principal", value, state)
    with pytest.raises(InvalidArgument, match=message):
        check_reconcile_principal("reconcile_principal", value, state)


def test_good_reconcile_principals_pass() -> None:
    assert check_reconcile_principal("reconcile_principal", "", EffectState.COMMITTED) == ""
    assert check_reconcile_principal("reconcile_principal", "bot-1", EffectState.UNKNOWN) == "bot-1"
