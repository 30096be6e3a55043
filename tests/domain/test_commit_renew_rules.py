"""coordinator.domain.decisions: decide_commit (write, replay or refuse: once, retry-safe) and
decide_renew (bounded)."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from coordinator.domain.decisions import (
    CommitDecision,
    CommitRefuse,
    CommitReplay,
    CommitWrite,
    FenceView,
    Verdict,
    check_fence,
    decide_commit,
    decide_renew,
    decide_stage,
    progress_interval,
)
from coordinator.domain.records import ClaimRecord
from coordinator.domain.states import AttemptEnd, FenceReason, Outcome, TaskState
from tests.domain.samples import (
    ATTEMPT,
    CLAIM,
    D1,
    D2,
    FENCE,
    GEN,
    HOLDER,
    NOW,
    R1,
    R2,
    TASK,
    pair,
    result_of,
)

DONE = replace(
    HOLDER,
    task=replace(TASK, state=TaskState.DONE),
    attempt=replace(ATTEMPT, end=AttemptEnd.COMMITTED),
    claim=None,
    result=result_of("a1", R1),
)


def _commit(view: FenceView, input_digest: str = D1, result_digest: str = R1) -> CommitDecision:
    return decide_commit(
        view, FENCE, input_digest=input_digest, result_digest=result_digest, now=NOW
    )


def _refusal(
    view: FenceView, input_digest: str = D1, result_digest: str = R1
) -> tuple[Outcome, FenceReason]:
    decision = _commit(view, input_digest, result_digest)
    assert isinstance(decision, CommitRefuse), decision
    assert not decision.verdict.accepted
    return pair(decision.verdict)


def test_the_holder_writes() -> None:
    assert _commit(HOLDER) == CommitWrite()
    assert pair(CommitWrite().verdict) == (Outcome.COMMITTED, FenceReason.NONE)


def test_a_retry_of_the_same_attempt_and_digest_replays_the_landed_result() -> None:
    assert _commit(DONE) == CommitReplay(result_of("a1", R1))
    # Even if the world moved on since (epoch bumped): the commit did land.
    assert _commit(replace(DONE, epoch=2)) == CommitReplay(result_of("a1", R1))
    replay = CommitReplay(result_of("a1", R1)).verdict
    assert pair(replay) == (Outcome.COMMITTED, FenceReason.NONE)
    assert replay.message == "already committed by this attempt"


def test_another_digest_from_the_same_attempt_is_already_committed() -> None:
    assert _refusal(DONE, result_digest=R2) == (Outcome.FENCED, FenceReason.ALREADY_COMMITTED)


def test_a_result_from_another_attempt_fences_even_a_holding_fence() -> None:
    view = replace(HOLDER, result=result_of("a0", R1, generation=FENCE.claim_generation - 5))
    assert _refusal(view) == (Outcome.FENCED, FenceReason.ALREADY_COMMITTED)


def test_a_different_input_digest_is_stale_input() -> None:
    assert _refusal(HOLDER, input_digest=D2) == (Outcome.STALE_INPUT, FenceReason.NONE)
    changed = replace(HOLDER, task=replace(TASK, input_digest=D2, revision=2))
    assert _refusal(changed, input_digest=D1) == (Outcome.STALE_INPUT, FenceReason.NONE)
    assert _refusal(changed, input_digest=D2) == (Outcome.STALE_INPUT, FenceReason.NONE)


@pytest.mark.parametrize(
    ("view", "expected"),
    [
        (replace(HOLDER, epoch=2), (Outcome.FENCED, FenceReason.EPOCH_CHANGED)),
        (replace(HOLDER, claim=None), (Outcome.FENCED, FenceReason.LEASE_EXPIRED)),
        (
            replace(HOLDER, task=replace(TASK, claim_generation=FENCE.claim_generation + 1)),
            (Outcome.FENCED, FenceReason.SUPERSEDED),
        ),
        (
            replace(HOLDER, task=replace(TASK, state=TaskState.CANCELLED, cancel_generation=1)),
            (Outcome.CANCELLED, FenceReason.NONE),
        ),
    ],
    ids=["epoch", "expired", "superseded", "cancelled"],
)
def test_a_failing_fence_is_passed_through(
    view: FenceView, expected: tuple[Outcome, FenceReason]
) -> None:
    assert _refusal(view) == expected
    assert _commit(view) == CommitRefuse(check_fence(view, FENCE, now=NOW))


@given(
    result_attempt=st.sampled_from([None, "a1", "a2"]),
    result_digest=st.sampled_from([R1, R2]),
    input_digest=st.sampled_from([D1, D2]),
    task_digest=st.sampled_from([D1, D2]),
    epoch=st.integers(1, 2),
    holds=st.booleans(),
    generation=st.sampled_from([GEN, GEN + 1]),
    cancelled=st.booleans(),
)
def test_each_case_has_exactly_one_decision(
    result_attempt: str | None,
    result_digest: str,
    input_digest: str,
    task_digest: str,
    epoch: int,
    holds: bool,
    generation: int,
    cancelled: bool,
) -> None:
    """Replay only for this attempt's own landed digest, Write only for a clean first commit
    under a holding fence, Refuse (never an accepting verdict) for everything else."""
    result = None if result_attempt is None else result_of(result_attempt, R1)
    task = replace(
        TASK,
        input_digest=task_digest,
        claim_generation=generation,
        state=TaskState.CANCELLED if cancelled else TaskState.CLAIMED,
        cancel_generation=1 if cancelled else 0,
    )
    view = replace(HOLDER, task=task, epoch=epoch, claim=CLAIM if holds else None, result=result)
    decision = decide_commit(
        view, FENCE, input_digest=input_digest, result_digest=result_digest, now=NOW
    )
    retry = result_attempt == FENCE.attempt_id and result_digest == R1
    fence_holds = epoch == 1 and holds and generation == GEN and not cancelled
    clean = input_digest == task_digest == D1
    first = result is None and clean and fence_holds
    if retry:
        assert decision == CommitReplay(result_of("a1", R1))
    elif first:
        assert decision == CommitWrite()
    else:
        assert isinstance(decision, CommitRefuse)
        assert not decision.verdict.accepted
        assert decision.verdict.outcome is not Outcome.COMMITTED


# --- decide_renew ------------------------------------------------------------------------------

RENEWABLE = replace(CLAIM, claimed_at=0.0, deadline=100.0, ttl=10, stall_timeout=20.0)


def test_renew_is_ok_up_to_the_deadline_and_not_after() -> None:
    assert decide_renew(RENEWABLE, now=90.0, progress="moved")[0].outcome is Outcome.OK
    verdict, update = decide_renew(RENEWABLE, now=90.5, progress="moved")
    assert (verdict.outcome, update) == (Outcome.RENEW_LIMIT, None)


def test_renew_without_progress_stalls_after_stall_timeout() -> None:
    assert decide_renew(RENEWABLE, now=20.0, progress="")[0].outcome is Outcome.OK
    verdict, update = decide_renew(RENEWABLE, now=20.5, progress="")
    assert (verdict.outcome, update) == (Outcome.STALLED, None)


def test_new_progress_renews_and_returns_the_record_to_write() -> None:
    verdict, update = decide_renew(RENEWABLE, now=50.0, progress="step-2")
    assert verdict.outcome is Outcome.OK
    assert update == replace(RENEWABLE, progress="step-2", progress_at=50.0)
    assert update is not None
    assert (update.generation, update.mod_revision) == (CLAIM.generation, CLAIM.mod_revision)


def test_a_marker_moving_sooner_than_the_interval_is_not_written_and_never_stalls() -> None:
    """Each renewal carrying a new marker wrote the claim record: 1,000 claims with 1,000
    character markers grew etcd 4.2 MiB/s. A marker is now written at most once per interval
    (5 s, or a quarter of the stall timeout), and one that moved sooner is not a stall."""
    written = replace(RENEWABLE, progress="step-1", progress_at=50.0)
    assert progress_interval(written) == 5.0
    assert decide_renew(written, now=54.9, progress="step-2") == (Verdict(Outcome.OK), None)
    assert decide_renew(written, now=55.0, progress="step-2")[1] == replace(
        written, progress="step-2", progress_at=55.0
    )
    short = replace(written, stall_timeout=4.0)  # a quarter of it: 1 s
    assert progress_interval(short) == 1.0
    assert decide_renew(short, now=50.5, progress="step-2") == (Verdict(Outcome.OK), None)
    assert decide_renew(short, now=51.0, progress="step-2")[1] is not None
    assert decide_renew(short, now=54.5, progress="step-1")[0].outcome is Outcome.STALLED


def test_stall_timeout_zero_never_stalls() -> None:
    claim = replace(RENEWABLE, stall_timeout=0.0)
    assert decide_renew(claim, now=89.0, progress="")[0].outcome is Outcome.OK


@given(
    ttl=st.integers(1, 300),
    claimed_at=st.floats(0, 1e6),
    duration=st.floats(0, 1e4),
    stall=st.floats(0, 1e3),
    marker=st.sampled_from(["", "a", "b"]),
    since_progress=st.floats(0, 2e3),
    elapsed=st.floats(0, 2e4),
    progress=st.sampled_from(["", "a", "b"]),
)
def test_renew_is_bounded(
    ttl: int,
    claimed_at: float,
    duration: float,
    stall: float,
    marker: str,
    since_progress: float,
    elapsed: float,
    progress: str,
) -> None:
    now = claimed_at + elapsed
    claim = ClaimRecord(
        attempt_id="a1",
        owner_id="w1",
        lease_id=7,
        ttl=ttl,
        claimed_at=claimed_at,
        deadline=claimed_at + duration,
        stall_timeout=stall,
        progress=marker,
        progress_at=now - since_progress,
        generation=100,
    )
    verdict, update = decide_renew(claim, now=now, progress=progress)
    if now + ttl > claim.deadline:
        assert (verdict.outcome, update) == (Outcome.RENEW_LIMIT, None)
    elif progress != marker and now - claim.progress_at < progress_interval(claim):
        assert (verdict.outcome, update) == (Outcome.OK, None)  # moved: written later
    elif progress != marker:
        assert verdict.outcome is Outcome.OK
        assert update == replace(claim, progress=progress, progress_at=now)
    elif stall > 0 and now - claim.progress_at > stall:
        assert (verdict.outcome, update) == (Outcome.STALLED, None)
    else:
        assert (verdict.outcome, update) == (Outcome.OK, None)
    if verdict.outcome is Outcome.OK:
        assert now + ttl <= claim.deadline
    assert verdict.reason is FenceReason.NONE


@given(
    deadline=st.sampled_from([0.0, NOW - 1, NOW, NOW + 1]),
    end=st.sampled_from(AttemptEnd),
    superseded=st.booleans(),
)
def test_a_stage_is_refused_only_once_the_deadline_ended_the_attempt(
    deadline: float, end: AttemptEnd, superseded: bool
) -> None:
    """Any attempt may stage, a fenced one too; past the deadline (or once the deadline pass
    ended the attempt) the stage is FENCED, DEADLINE_EXCEEDED, like every acceptance point."""
    task = replace(TASK, deadline=deadline, claim_generation=GEN + 1 if superseded else GEN)
    view = FenceView(task, replace(ATTEMPT, end=end), CLAIM, 1)
    past = bool(deadline and deadline <= NOW) or end is AttemptEnd.TIMED_OUT
    fenced = (Outcome.FENCED, FenceReason.DEADLINE_EXCEEDED)
    assert pair(decide_stage(view, now=NOW)) == (fenced if past else (Outcome.OK, FenceReason.NONE))


def test_a_commit_decided_after_the_deadline_is_fenced_deadline_exceeded() -> None:
    view = replace(HOLDER, task=replace(TASK, deadline=NOW))
    decision = decide_commit(view, FENCE, input_digest=D1, result_digest=R1, now=NOW)
    assert decision == CommitRefuse(check_fence(view, FENCE, now=NOW))
    assert pair(decision.verdict) == (Outcome.FENCED, FenceReason.DEADLINE_EXCEEDED)
    early = decide_commit(view, FENCE, input_digest=D1, result_digest=R1, now=NOW - 1)
    assert isinstance(early, CommitWrite)
