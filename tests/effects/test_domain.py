"""coordinator.domain.effects: what prepare, record and the hold decide (the effect id itself:
tests/domain/test_effect_ids.py)."""

from __future__ import annotations

from dataclasses import replace
from enum import IntEnum

import pytest

from coordinator.domain.digests import digest_of
from coordinator.domain.effect_ids import effect_id
from coordinator.domain.effects import (
    EffectAction,
    EffectRecord,
    EffectState,
    PrepareRequest,
    check_effect_id,
    check_name,
    decide_hold,
    decide_prepare,
    decide_record,
    resolve,
)
from coordinator.domain.records import TaskRecord, decode, encode
from coordinator.domain.states import Outcome, TaskState
from coordinator.errors import FailedPrecondition, InvalidArgument
from coordinator.metrics import AcceptancePoint
from coordinator.v1 import admin_pb2, types_pb2

X, Y = digest_of(b"payload X"), digest_of(b"payload Y")
A_GEN, B_GEN = 10, 20
NOW = 1_700_000_000.0
CREATED = 7  # the task key's create_revision


def request(digest: str = X, generation: int = A_GEN, revision: int = 1) -> PrepareRequest:
    eid = effect_id("t1", CREATED, revision, "notify", "email")
    return PrepareRequest(eid, "t1", revision, "notify", "email", digest, generation, "a1", "w1")


def prepared(state: EffectState = EffectState.PREPARED, **changes: object) -> EffectRecord:
    """The effect as A's first prepare created it, then changed."""
    first = decide_prepare(None, request(), NOW).write
    assert first is not None
    return replace(first, state=state, mod_revision=11, **changes)  # type: ignore[arg-type]


# --- wire enums ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("enum", "proto", "prefix", "zero"),
    [
        (EffectState, types_pb2.EffectState, "EFFECT_STATE_", None),
        (EffectAction, types_pb2.EffectAction, "EFFECT_ACTION_", "NONE"),
        (AcceptancePoint, admin_pb2.AcceptancePoint, "ACCEPTANCE_POINT_", None),
    ],
)
def test_enum_values_equal_the_proto_values(
    enum: type[IntEnum], proto: object, prefix: str, zero: str | None
) -> None:
    wire = {name.removeprefix(prefix): value for name, value in proto.items()}  # type: ignore[attr-defined]
    assert wire.pop("UNSPECIFIED") == 0
    ours = {member.name: member.value for member in enum}
    if zero is not None:
        assert ours.pop(zero) == 0
    assert ours == wire


def test_the_new_outcomes_are_on_the_wire() -> None:
    assert int(types_pb2.OUTCOME_PAYLOAD_CONFLICT) == int(Outcome.PAYLOAD_CONFLICT) == 14
    assert int(types_pb2.OUTCOME_NEEDS_APPROVAL) == int(Outcome.NEEDS_APPROVAL) == 15


# --- prepare ------------------------------------------------------------------------------


def test_a_first_prepare_binds_the_digest_and_executes() -> None:
    decision = decide_prepare(None, request(), NOW)
    assert (decision.verdict.outcome, decision.action) == (Outcome.OK, EffectAction.EXECUTE)
    assert decision.write is not None
    assert decision.write.state is EffectState.PREPARED
    assert (decision.write.payload_digest, decision.write.prepared_generation) == (X, A_GEN)
    assert decision.write.effect_id == effect_id("t1", CREATED, 1, "notify", "email")


@pytest.mark.parametrize(
    ("existing", "generation", "action", "writes"),
    [
        # COMMITTED: skip, whoever asks.
        (prepared(EffectState.COMMITTED, external_ref="msg-1"), B_GEN, EffectAction.SKIP, False),
        # A retry of A's own prepare: execute again, nothing to write.
        (prepared(), A_GEN, EffectAction.EXECUTE, False),
        # A left it PREPARED or UNKNOWN: B must reconcile, and becomes a reconciler (written).
        (prepared(), B_GEN, EffectAction.RECONCILE, True),
        (prepared(EffectState.UNKNOWN), B_GEN, EffectAction.RECONCILE, True),
        # A itself recorded UNKNOWN: A reconciles too (it may record already: nothing written).
        (prepared(EffectState.UNKNOWN), A_GEN, EffectAction.RECONCILE, False),
        # B was told to reconcile before: told again, nothing new to write.
        (prepared(reconciler_generation=B_GEN), B_GEN, EffectAction.RECONCILE, False),
        # Confirmed absent: execute with the same key, PREPARED again by the new generation.
        (prepared(EffectState.ABSENT), B_GEN, EffectAction.EXECUTE, True),
    ],
    ids=["committed", "retry", "prepared", "unknown", "own-unknown", "reconciler", "absent"],
)
def test_a_later_prepare_with_the_same_digest(
    existing: EffectRecord, generation: int, action: EffectAction, writes: bool
) -> None:
    decision = decide_prepare(existing, request(X, generation), NOW)
    assert (decision.verdict.outcome, decision.action) == (Outcome.OK, action)
    assert (decision.write is not None) == writes
    assert decision.effect.effect_id == existing.effect_id
    assert decision.effect.payload_digest == X
    if action is EffectAction.RECONCILE:
        assert decision.effect.may_record(generation)
    if existing.state is EffectState.ABSENT:
        assert decision.write is not None
        assert decision.write.state is EffectState.PREPARED
        assert decision.write.prepared_generation == generation


@pytest.mark.parametrize(
    ("state", "action"),
    [
        (EffectState.PREPARED, EffectAction.RECONCILE),
        (EffectState.UNKNOWN, EffectAction.RECONCILE),
        (EffectState.COMMITTED, EffectAction.SKIP),
        (EffectState.ABSENT, EffectAction.NONE),
    ],
)
def test_another_digest_is_a_payload_conflict_with_the_original(
    state: EffectState, action: EffectAction
) -> None:
    decision = decide_prepare(prepared(state), request(Y, B_GEN), NOW)
    assert decision.verdict.outcome is Outcome.PAYLOAD_CONFLICT
    assert decision.action is action
    assert decision.effect.payload_digest == X  # the original digest, never rebound
    assert X in decision.verdict.message
    if decision.write is not None:
        assert decision.write.payload_digest == X
        assert decision.write.state is state


# --- record -------------------------------------------------------------------------------


def record(
    existing: EffectRecord, state: EffectState, generation: int = A_GEN, ref: str = ""
) -> EffectRecord | None:
    return decide_record(
        existing,
        state=state,
        external_ref=ref,
        etag="",
        generation=generation,
        principal="w",
        now=NOW,
    )


@pytest.mark.parametrize("state", [EffectState.COMMITTED, EffectState.UNKNOWN, EffectState.ABSENT])
@pytest.mark.parametrize("start", [EffectState.PREPARED, EffectState.UNKNOWN])
def test_an_uncertain_effect_records_any_outcome(start: EffectState, state: EffectState) -> None:
    existing = prepared(start)
    if start is state:
        assert record(existing, state) is None  # a repeat writes nothing
        return
    after = record(existing, state, ref="msg-7" if state is EffectState.COMMITTED else "")
    assert after is not None
    assert (after.state, after.recorded_generation, after.payload_digest) == (state, A_GEN, X)


def test_a_reconciler_may_record_but_a_stranger_may_not() -> None:
    existing = prepared(EffectState.UNKNOWN, reconciler_generation=B_GEN)
    after = record(existing, EffectState.COMMITTED, B_GEN, "msg-1")
    assert after is not None and after.state is EffectState.COMMITTED
    with pytest.raises(FailedPrecondition, match="call PrepareEffect first"):
        record(prepared(), EffectState.ABSENT, generation=B_GEN)


def test_committed_is_final() -> None:
    done = prepared(EffectState.COMMITTED, external_ref="msg-1")
    assert record(done, EffectState.COMMITTED, ref="msg-1") is None  # a retried record
    for state, ref in [
        (EffectState.ABSENT, ""),
        (EffectState.UNKNOWN, ""),
        (EffectState.COMMITTED, "msg-2"),
    ]:
        with pytest.raises(FailedPrecondition, match="is COMMITTED"):
            record(done, state, ref=ref)


def test_absent_goes_back_to_prepared_only_through_a_prepare() -> None:
    absent = prepared(EffectState.ABSENT)
    assert record(absent, EffectState.ABSENT) is None
    with pytest.raises(FailedPrecondition, match="call PrepareEffect before"):
        record(absent, EffectState.COMMITTED, ref="msg-1")


def test_prepared_is_not_recordable() -> None:
    with pytest.raises(InvalidArgument, match="COMMITTED, UNKNOWN or ABSENT"):
        record(prepared(), EffectState.PREPARED)


# --- non-replayable hold and approval -----------------------------------------------------

TASK = TaskRecord("t1", "q", X, TaskState.READY, attempt=1, non_replayable=True)


@pytest.mark.parametrize("state", list(EffectState))
def test_only_uncertain_effects_hold_a_non_replayable_task(state: EffectState) -> None:
    verdict = decide_hold(TASK, [prepared(state)])
    if state in (EffectState.PREPARED, EffectState.UNKNOWN):
        assert verdict is not None and verdict.outcome is Outcome.NEEDS_APPROVAL
        assert prepared().effect_id in verdict.message
    else:
        assert verdict is None


def test_a_replayable_task_is_never_held() -> None:
    assert decide_hold(replace(TASK, non_replayable=False), [prepared()]) is None
    assert decide_hold(TASK, []) is None


@pytest.mark.parametrize("resolution", [EffectState.ABSENT, EffectState.COMMITTED])
def test_an_approval_resolves_an_uncertain_effect(resolution: EffectState) -> None:
    after = resolve(prepared(EffectState.UNKNOWN), resolution, by="ops", reason="mail log", now=NOW)
    assert after.state is resolution and not after.uncertain
    assert "ops" in after.detail and "mail log" in after.detail
    with pytest.raises(InvalidArgument):
        resolve(prepared(), EffectState.UNKNOWN, by="ops", reason="", now=NOW)


# --- records and validation ---------------------------------------------------------------


def test_the_record_round_trips_through_json() -> None:
    effect = prepared(EffectState.COMMITTED, external_ref="msg-1", etag="e1")
    again = decode(EffectRecord, encode(effect), mod_revision=11)
    assert again == effect and again.mod_revision == 11
    assert b'"state":"COMMITTED"' in encode(effect)


@pytest.mark.parametrize(
    "bad", ["", "eff-", "eff-" + "A" * 64, "eff-" + "0" * 63, "x" + "0" * 67, "eff-" + "0" * 65]
)
def test_malformed_effect_ids_are_refused(bad: str) -> None:
    with pytest.raises(InvalidArgument, match="effect_id"):
        check_effect_id(bad)


@pytest.mark.parametrize("bad", ["", "a b", "x" * 129, "é", "a\nb"])
def test_malformed_node_and_slot_names_are_refused(bad: str) -> None:
    with pytest.raises(InvalidArgument, match="effect_slot"):
        check_name("effect_slot", bad)
    assert check_name("node_id", "plan/step-1:send@v2") == "plan/step-1:send@v2"
