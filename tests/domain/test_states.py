"""coordinator.domain.states: enum values match the wire, and only listed transitions exist."""

from __future__ import annotations

import re
from collections import deque
from enum import IntEnum

import pytest
from hypothesis import given
from hypothesis import strategies as st

from coordinator.domain.states import (
    REVIEW_ON_COMMIT,
    TERMINAL_STATES,
    TRANSITIONS,
    TRANSITIONS_WITH_REVIEW,
    AttemptEnd,
    FenceReason,
    IllegalTransition,
    Op,
    Outcome,
    TaskState,
    WaitingReason,
    is_legal,
    next_state,
)
from coordinator.v1 import types_pb2

# (python enum, proto enum, prefix of the proto value names, python name of proto value 0)
WIRE = [
    (TaskState, types_pb2.TaskState, "TASK_STATE_", None),
    (Outcome, types_pb2.Outcome, "OUTCOME_", None),
    (FenceReason, types_pb2.FenceReason, "FENCE_REASON_", "NONE"),
    (AttemptEnd, types_pb2.AttemptEnd, "ATTEMPT_END_", "RUNNING"),
    (WaitingReason, types_pb2.WaitingReason, "WAITING_REASON_", "NONE"),
]
FROM_STATES: list[TaskState | None] = [None, *TaskState]


@pytest.mark.parametrize(("enum", "proto", "prefix", "zero"), WIRE)
def test_enum_values_equal_the_proto_values(
    enum: type[IntEnum], proto: object, prefix: str, zero: str | None
) -> None:
    wire = {name.removeprefix(prefix): value for name, value in proto.items()}  # type: ignore[attr-defined]
    assert wire.pop("UNSPECIFIED") == 0
    ours = {member.name: member.value for member in enum}
    if zero is not None:
        assert ours.pop(zero) == 0  # the proto's UNSPECIFIED, under a meaningful name
    assert ours == wire


def test_spot_check_the_wire_values() -> None:
    assert int(types_pb2.OUTCOME_FENCED) == int(Outcome.FENCED) == 4
    assert int(types_pb2.TASK_STATE_CLAIMED) == int(TaskState.CLAIMED) == 3
    assert int(types_pb2.FENCE_REASON_SUPERSEDED) == int(FenceReason.SUPERSEDED) == 1
    assert int(types_pb2.ATTEMPT_END_EXPIRED) == int(AttemptEnd.EXPIRED) == 3
    assert Outcome(types_pb2.OUTCOME_RENEW_LIMIT) is Outcome.RENEW_LIMIT


@pytest.mark.parametrize(("enum", "proto", "prefix", "zero"), WIRE)
def test_enums_print_their_names_and_still_compare_as_integers(
    enum: type[IntEnum], proto: object, prefix: str, zero: str | None
) -> None:
    for member in enum:
        assert (str(member), f"{member}", "%s" % member) == (member.name,) * 3  # noqa: UP031
        assert member == member.value
    assert repr(TaskState.READY) == "<TaskState.READY: 2>"


def test_op_values_are_lowercase_names() -> None:
    assert {op.value for op in Op} == {op.name.lower() for op in Op}


@pytest.mark.parametrize(("key", "target"), TRANSITIONS.items(), ids=str)
def test_every_listed_transition_is_legal(
    key: tuple[TaskState | None, Op], target: TaskState
) -> None:
    current, op = key
    assert next_state(current, op) is target
    assert is_legal(current, op)
    if key != REVIEW_ON_COMMIT:
        assert next_state(current, op, requires_review=True) is target


def test_commit_with_review_goes_to_review() -> None:
    assert next_state(TaskState.CLAIMED, Op.COMMIT) is TaskState.DONE
    assert next_state(TaskState.CLAIMED, Op.COMMIT, requires_review=True) is TaskState.REVIEW
    assert set(TRANSITIONS_WITH_REVIEW) == set(TRANSITIONS)


NOT_LISTED = [(c, op) for c in FROM_STATES for op in Op if (c, op) not in TRANSITIONS]


@pytest.mark.parametrize("key", NOT_LISTED, ids=str)
@pytest.mark.parametrize("review", [False, True])
def test_anything_not_listed_raises_illegal_transition(
    key: tuple[TaskState | None, Op], review: bool
) -> None:
    current, op = key
    assert not is_legal(current, op)
    name = re.escape(current.name if current is not None else "(none)")
    with pytest.raises(IllegalTransition, match=rf"^no transition {name} --{op.value}-->$"):
        next_state(current, op, requires_review=review)


def test_the_exact_set_of_legal_transitions() -> None:
    legal = {(c, op) for c in FROM_STATES for op in Op if is_legal(c, op)}
    assert legal == set(TRANSITIONS)
    assert len(NOT_LISTED) == len(FROM_STATES) * len(Op) - len(TRANSITIONS)


def test_terminal_states_have_no_way_out_but_an_operators_retry_of_a_dead_letter() -> None:
    assert {TaskState.DONE, TaskState.CANCELLED, TaskState.FAILED} == TERMINAL_STATES
    ways_out = {state: [op for op in Op if is_legal(state, op)] for state in TERMINAL_STATES}
    assert ways_out == {TaskState.DONE: [], TaskState.CANCELLED: [], TaskState.FAILED: [Op.RETRY]}


def _reachable() -> set[TaskState | None]:
    seen: set[TaskState | None] = {None}
    todo: deque[TaskState | None] = deque([None])
    while todo:
        current = todo.popleft()
        for (source, _), target in [*TRANSITIONS.items(), *TRANSITIONS_WITH_REVIEW.items()]:
            if source == current and target not in seen:
                seen.add(target)
                todo.append(target)
    return seen


@pytest.mark.parametrize("key", list(TRANSITIONS), ids=str)
def test_every_transition_entry_is_reachable_from_creation(
    key: tuple[TaskState | None, Op],
) -> None:
    assert key[0] in _reachable()


def test_the_claim_lifecycle_states_are_reachable() -> None:
    assert _reachable() >= {
        None,
        TaskState.READY,
        TaskState.CLAIMED,
        TaskState.DONE,
        TaskState.REVIEW,
        TaskState.CANCELLED,
        TaskState.FAILED,
        TaskState.DELAYED,
    }


@given(st.lists(st.sampled_from(list(Op)), max_size=30), st.booleans())
def test_any_op_sequence_follows_the_table_or_raises(ops: list[Op], review: bool) -> None:
    table = TRANSITIONS_WITH_REVIEW if review else TRANSITIONS
    current: TaskState | None = None
    for op in ops:
        expected = table.get((current, op))
        if expected is None:
            with pytest.raises(IllegalTransition):
                next_state(current, op, requires_review=review)
        else:
            current = next_state(current, op, requires_review=review)
            assert current is expected
        assert current in _reachable()
