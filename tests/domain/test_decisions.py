"""coordinator.domain.decisions: claim, owner and fence rules, case by case and as properties."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from coordinator.domain.decisions import (
    ClaimLimits,
    FenceView,
    Verdict,
    check_fence,
    check_owner,
    clamp_ttl,
    decide_claim,
)
from coordinator.domain.records import ClaimRecord, TaskRecord
from coordinator.domain.states import AttemptEnd, FenceReason, Outcome, TaskState
from coordinator.errors import InvalidArgument, PermissionDenied
from tests.domain.samples import ATTEMPT, CLAIM, D1, D2, FENCE, GEN, HOLDER, NOW, TASK, pair

# --- Verdict and clamp_ttl ---------------------------------------------------------------------


@pytest.mark.parametrize("outcome", list(Outcome), ids=str)
def test_only_ok_claimed_and_committed_are_accepted(outcome: Outcome) -> None:
    accepted = outcome in (Outcome.OK, Outcome.CLAIMED, Outcome.COMMITTED)
    assert Verdict(outcome).accepted is accepted


@pytest.mark.parametrize(
    ("requested", "granted"), [(1000, 30), (1, 2), (2, 2), (17, 17), (30, 30), (0, 2), (-5, 2)]
)
def test_clamp_ttl_cases(requested: int, granted: int) -> None:
    assert clamp_ttl(requested, ClaimLimits(min_ttl=2, max_ttl=30)) == granted


@given(st.integers(-(10**9), 10**9), st.integers(1, 1000), st.integers(0, 1000))
def test_clamp_ttl_is_always_within_bounds(requested: int, low: int, span: int) -> None:
    limits = ClaimLimits(min_ttl=low, max_ttl=low + span)
    granted = clamp_ttl(requested, limits)
    assert limits.min_ttl <= granted <= limits.max_ttl
    if limits.min_ttl <= requested <= limits.max_ttl:
        assert granted == requested
    assert clamp_ttl(granted, limits) == granted
    assert clamp_ttl(requested + 1, limits) >= granted


# --- decide_claim ------------------------------------------------------------------------------


def _claim(task: TaskRecord, **kw: object) -> Verdict:
    args: dict[str, object] = {
        "claim_alive": False,
        "expected_state_version": 0,
        "caller_epoch": 1,
        "current_epoch": 1,
        "paused": False,
    } | kw
    return decide_claim(task, **args)  # type: ignore[arg-type]


def test_decide_claim_cases() -> None:
    ready = replace(TASK, state=TaskState.READY)
    assert pair(_claim(ready)) == (Outcome.CLAIMED, FenceReason.NONE)
    assert _claim(TASK, claim_alive=True).outcome is Outcome.ALREADY_CLAIMED
    assert _claim(TASK, claim_alive=False).outcome is Outcome.CLAIMED  # the old lease expired
    assert _claim(ready, paused=True).outcome is Outcome.CLAIMS_PAUSED
    assert pair(_claim(ready, caller_epoch=2)) == (Outcome.FENCED, FenceReason.EPOCH_CHANGED)
    stale = _claim(ready, expected_state_version=GEN - 1)
    assert stale.outcome is Outcome.STALE_STATE_VERSION
    assert _claim(ready, expected_state_version=GEN).outcome is Outcome.CLAIMED
    # Paused beats a wrong epoch, which beats a stale state version.
    assert _claim(ready, paused=True, caller_epoch=2).outcome is Outcome.CLAIMS_PAUSED
    both = _claim(ready, caller_epoch=2, expected_state_version=1)
    assert both.outcome is Outcome.FENCED


@pytest.mark.parametrize(
    "state", [s for s in TaskState if s not in (TaskState.READY, TaskState.CLAIMED)], ids=str
)
def test_other_states_are_not_claimable(state: TaskState) -> None:
    assert _claim(replace(TASK, state=state)).outcome is Outcome.NOT_CLAIMABLE


@given(
    state=st.sampled_from(TaskState),
    alive=st.booleans(),
    expected=st.sampled_from([0, GEN - 1, GEN]),
    caller=st.integers(1, 3),
    current=st.integers(1, 3),
    paused=st.booleans(),
)
def test_decide_claim_accepts_exactly_the_claimable(
    state: TaskState, alive: bool, expected: int, caller: int, current: int, paused: bool
) -> None:
    verdict = _claim(
        replace(TASK, state=state),
        claim_alive=alive,
        expected_state_version=expected,
        caller_epoch=caller,
        current_epoch=current,
        paused=paused,
    )
    claimable = state is TaskState.READY or (state is TaskState.CLAIMED and not alive)
    assert verdict.accepted == (
        not paused and caller == current and expected in (0, GEN) and claimable
    )
    assert (verdict.reason is FenceReason.EPOCH_CHANGED) == (verdict.outcome is Outcome.FENCED)


# --- check_owner -------------------------------------------------------------------------------


def test_check_owner() -> None:
    check_owner(HOLDER, FENCE, "w1")
    with pytest.raises(PermissionDenied, match="'w1', not to 'w2'"):
        check_owner(HOLDER, FENCE, "w2")
    with pytest.raises(InvalidArgument, match="does not belong"):
        check_owner(HOLDER, replace(FENCE, claim_generation=GEN + 1), "w1")
    with pytest.raises(InvalidArgument, match="cancel_generation 1 was never handed out"):
        check_owner(HOLDER, replace(FENCE, cancel_generation=1), "w1")
    # A real cancellation after the claim is an outcome, not an error (check_fence says it).
    check_owner(replace(HOLDER, task=replace(TASK, cancel_generation=1)), FENCE, "w1")


# --- check_fence -------------------------------------------------------------------------------

NEWER = replace(TASK, claim_generation=GEN + 5, attempt_id="a2")
CASES = {
    "holder": (HOLDER, (Outcome.OK, FenceReason.NONE)),
    "cancelled": (
        replace(HOLDER, task=replace(TASK, state=TaskState.CANCELLED, cancel_generation=1)),
        (Outcome.CANCELLED, FenceReason.NONE),
    ),
    "cancel generation moved": (
        replace(HOLDER, task=replace(TASK, cancel_generation=1)),
        (Outcome.CANCELLED, FenceReason.NONE),
    ),
    "revision moved": (
        replace(HOLDER, task=replace(TASK, revision=2)),
        (Outcome.STALE_INPUT, FenceReason.NONE),
    ),
    "input digest moved": (
        replace(HOLDER, task=replace(TASK, input_digest=D2)),
        (Outcome.STALE_INPUT, FenceReason.NONE),
    ),
    "epoch moved": (replace(HOLDER, epoch=2), (Outcome.FENCED, FenceReason.EPOCH_CHANGED)),
    "re-claimed": (
        replace(HOLDER, task=NEWER, claim=replace(CLAIM, attempt_id="a2", generation=GEN + 5)),
        (Outcome.FENCED, FenceReason.SUPERSEDED),
    ),
    "released and re-claimed": (
        replace(HOLDER, task=NEWER, claim=None, attempt=replace(ATTEMPT, end=AttemptEnd.RELEASED)),
        (Outcome.FENCED, FenceReason.SUPERSEDED),
    ),
    "released": (
        replace(
            HOLDER,
            task=replace(TASK, state=TaskState.READY),
            claim=None,
            attempt=replace(ATTEMPT, end=AttemptEnd.RELEASED),
        ),
        (Outcome.FENCED, FenceReason.RELEASED),
    ),
    "committed": (
        replace(
            HOLDER,
            task=replace(TASK, state=TaskState.DONE),
            claim=None,
            attempt=replace(ATTEMPT, end=AttemptEnd.COMMITTED),
        ),
        (Outcome.FENCED, FenceReason.ALREADY_COMMITTED),
    ),
    "lease expired": (replace(HOLDER, claim=None), (Outcome.FENCED, FenceReason.LEASE_EXPIRED)),
    "reclaimed": (
        replace(
            HOLDER,
            task=replace(TASK, state=TaskState.READY),
            claim=None,
            attempt=replace(ATTEMPT, end=AttemptEnd.EXPIRED),
        ),
        (Outcome.FENCED, FenceReason.LEASE_EXPIRED),
    ),
    "claim key of another attempt": (
        replace(HOLDER, claim=replace(CLAIM, attempt_id="a9")),
        (Outcome.FENCED, FenceReason.LEASE_EXPIRED),
    ),
    # The most specific reason wins: cancelled > stale input > epoch > generation.
    "cancelled and stale and old epoch": (
        replace(HOLDER, task=replace(NEWER, cancel_generation=1, revision=2), epoch=2),
        (Outcome.CANCELLED, FenceReason.NONE),
    ),
    "stale and old epoch": (
        replace(HOLDER, task=replace(NEWER, revision=2), epoch=2),
        (Outcome.STALE_INPUT, FenceReason.NONE),
    ),
    "old epoch and re-claimed": (
        replace(HOLDER, task=NEWER, epoch=2),
        (Outcome.FENCED, FenceReason.EPOCH_CHANGED),
    ),
}


@pytest.mark.parametrize("case", CASES)
def test_check_fence_cases(case: str) -> None:
    view, expected = CASES[case]
    assert pair(check_fence(view, FENCE, now=NOW)) == expected


def test_no_attempt_is_current_once_the_tasks_deadline_has_passed() -> None:
    """The holder is refused FENCED (DEADLINE_EXCEEDED) from the deadline on, even before the
    deadline pass moved the task: no result or effect lands after schedule_to_close."""
    timed = replace(HOLDER, task=replace(TASK, deadline=NOW))
    assert pair(check_fence(timed, FENCE, now=NOW)) == (
        Outcome.FENCED,
        FenceReason.DEADLINE_EXCEEDED,
    )
    assert check_fence(timed, FENCE, now=NOW - 0.001).accepted
    # A deadline of 0 is none; a cancel names the more specific reason.
    assert check_fence(HOLDER, FENCE, now=1e12).accepted
    cancelled = replace(timed, task=replace(timed.task, cancel_generation=1))
    assert check_fence(cancelled, FENCE, now=NOW).outcome is Outcome.CANCELLED


@given(
    state=st.sampled_from(TaskState),
    cancel_generation=st.integers(0, 1),
    revision=st.integers(1, 2),
    digest=st.sampled_from([D1, D2]),
    task_generation=st.sampled_from([GEN - 1, GEN, GEN + 1]),
    end=st.sampled_from(AttemptEnd),
    claim=st.none()
    | st.builds(
        lambda attempt_id, generation: replace(CLAIM, attempt_id=attempt_id, generation=generation),
        st.sampled_from(["a1", "a2"]),
        st.sampled_from([GEN - 1, GEN, GEN + 1]),
    ),
    epoch=st.integers(1, 2),
)
def test_check_fence_is_ok_only_when_every_part_matches(
    state: TaskState,
    cancel_generation: int,
    revision: int,
    digest: str,
    task_generation: int,
    end: AttemptEnd,
    claim: ClaimRecord | None,
    epoch: int,
) -> None:
    task = replace(
        TASK,
        state=state,
        cancel_generation=cancel_generation,
        revision=revision,
        input_digest=digest,
        claim_generation=task_generation,
    )
    view = FenceView(task, replace(ATTEMPT, end=end), claim, epoch)
    verdict = check_fence(view, FENCE, now=NOW)
    every_part = (
        state is TaskState.CLAIMED
        and cancel_generation == FENCE.cancel_generation
        and (revision, digest) == (ATTEMPT.revision, ATTEMPT.input_digest)
        and epoch == FENCE.scheduler_epoch
        and task_generation == FENCE.claim_generation
        and claim is not None
        and (claim.generation, claim.attempt_id) == (GEN, FENCE.attempt_id)
    )
    assert verdict.accepted == every_part == (verdict.outcome is Outcome.OK)
    assert (verdict.reason is not FenceReason.NONE) == (verdict.outcome is Outcome.FENCED)
    # claim.v1's answers only: a passed deadline is FENCED with a reason, not an outcome.
    assert verdict.outcome in (
        Outcome.OK,
        Outcome.FENCED,
        Outcome.CANCELLED,
        Outcome.STALE_INPUT,
    )
    # Only an attempt the task's deadline ended reads DEADLINE_EXCEEDED (tests/workqueue).
    if verdict.reason is FenceReason.DEADLINE_EXCEEDED:
        assert end is AttemptEnd.TIMED_OUT
