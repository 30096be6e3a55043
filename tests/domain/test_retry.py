"""coordinator.domain.retry: the one decision after an attempt ends without a result."""

from __future__ import annotations

import itertools
from dataclasses import replace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from coordinator.domain.records import TaskRecord
from coordinator.domain.retry import (
    COUNTED_ENDS,
    LEASE_EXPIRED,
    MAX_BACKOFF,
    SHUTDOWN_ALLOWANCE,
    UNCOUNTED_ENDS,
    UNDELIVERED,
    AttemptEnded,
    DeadLetter,
    Requeue,
    RetryDefaults,
    RetryPolicy,
    Uncounted,
    attempts_counted,
    check_policy,
    decide_after,
    decide_retry,
    expired,
    jitter_fraction,
    policy_fields,
    retried_deadline,
    retry_move,
    takeover,
    undelivered_move,
)
from coordinator.domain.states import AttemptEnd, DeadLetterReason, Op, TaskState
from coordinator.errors import FailedPrecondition, InvalidArgument

NOW = 1_700_000_000.0

policies = st.builds(
    RetryPolicy,
    max_attempts=st.integers(0, 20),
    initial_backoff=st.floats(0, 60),
    backoff_multiplier=st.floats(1, 10),
    max_backoff=st.floats(60, MAX_BACKOFF),
    non_retryable_errors=st.lists(st.sampled_from(["Bad", "Fatal"]), max_size=2).map(tuple),
    backoff_jitter=st.floats(0, 1),
)
ends = st.builds(
    AttemptEnded,
    end=st.sampled_from(sorted(COUNTED_ENDS)),
    error=st.just("boom"),
    retryable=st.booleans(),
    code=st.sampled_from(["", "Bad", "Fatal", "Flaky"]),
    delay=st.floats(0, 3600),
)


@given(policies, st.integers(1, 10_000), ends)
def test_the_decision_is_exactly_the_rules(
    policy: RetryPolicy, attempts: int, ended: AttemptEnded
) -> None:
    decision = decide_retry(policy, attempts, ended, NOW)
    if not ended.retryable or ended.code in policy.non_retryable_errors:
        assert isinstance(decision, DeadLetter)
        assert decision.reason is DeadLetterReason.NON_RETRYABLE
        assert "last error: boom" in decision.detail
    elif policy.max_attempts and attempts >= policy.max_attempts:
        assert decision == DeadLetter(
            DeadLetterReason.EXHAUSTED,
            f"all {policy.max_attempts} attempts used; last error: boom",
        )
    else:
        assert decision == Requeue(NOW + max(policy.delay(attempts, ""), ended.delay))


@given(policies, st.integers(1, 10_000))
def test_backoff_grows_with_each_attempt_and_stays_within_its_bounds(
    policy: RetryPolicy, attempts: int
) -> None:
    first, this, following = (
        policy.backoff(1),
        policy.backoff(attempts),
        policy.backoff(attempts + 1),
    )
    assert first == min(policy.initial_backoff, policy.max_backoff)
    assert 0 <= this <= following <= max(policy.max_backoff, 0)
    if policy.initial_backoff == 0:
        assert following == 0


def test_backoff_by_example() -> None:
    policy = RetryPolicy(initial_backoff=2, backoff_multiplier=3, max_backoff=50)
    assert [policy.backoff(n) for n in range(1, 6)] == [2, 6, 18, 50, 50]


@given(policies, st.integers(1, 10_000), st.text(max_size=20))
def test_jitter_only_lengthens_a_wait_within_its_fraction_and_is_fixed_per_task_and_attempt(
    policy: RetryPolicy, attempts: int, key: str
) -> None:
    base, delay = policy.backoff(attempts), policy.delay(attempts, key)
    assert base <= delay <= base * (1 + policy.backoff_jitter)
    assert delay == policy.delay(attempts, key)  # the same on every replica and every replay
    assert 0 <= jitter_fraction(key, attempts) < 1


def test_jitter_spreads_the_tasks_that_failed_together() -> None:
    policy = RetryPolicy()  # the server's default: 1 s doubling, jitter 0.2
    waits = [policy.delay(1, f"task-{n}") for n in range(100)]
    assert min(waits) >= 1.0 and max(waits) < 1.2
    assert len(set(waits)) == 100
    # Spread over the range, not bunched: each fifth of it gets some of them.
    assert {int((w - 1.0) / 0.04) for w in waits} == {0, 1, 2, 3, 4}
    assert RetryPolicy(backoff_jitter=0).delay(3, "t") == 4.0


def test_the_default_policy_cannot_dead_letter_a_task_in_under_15_seconds() -> None:
    """A handler that fails every time: each Fail comes the instant its attempt is claimed,
    and still the 5th (last) attempt cannot start before 1 + 2 + 4 + 8 s have passed."""
    policy, now, starts = RetryPolicy(), NOW, [NOW]
    failed = AttemptEnded(AttemptEnd.FAILED, "Bug: always", code="Bug")
    for attempts in range(1, 6):
        decision = decide_retry(policy, attempts, failed, now, key="t1")
        if attempts == 5:
            assert isinstance(decision, DeadLetter)
            assert decision.reason is DeadLetterReason.EXHAUSTED
            break
        assert isinstance(decision, Requeue)
        now = decision.at
        starts.append(now)
    gaps = [b - a for a, b in itertools.pairwise(starts)]
    assert all(base <= g < base * 1.2 for g, base in zip(gaps, (1, 2, 4, 8), strict=True))
    assert starts[-1] - starts[0] >= 15.0


@given(st.integers(1, 10_000), ends.filter(lambda e: e.retryable and not e.code))
def test_unlimited_attempts_are_never_exhausted(attempts: int, ended: AttemptEnded) -> None:
    decision = decide_retry(RetryPolicy(max_attempts=0), attempts, ended, NOW)
    assert isinstance(decision, Requeue)


@pytest.mark.parametrize(
    "end", [e for e in AttemptEnd if e not in COUNTED_ENDS | UNCOUNTED_ENDS], ids=lambda e: e.name
)
def test_ends_that_do_not_ask_for_another_attempt_are_a_bug_here(end: AttemptEnd) -> None:
    with pytest.raises(ValueError, match=f"ended {end.name} is not retried"):
        decide_retry(RetryPolicy(), 1, AttemptEnded(end, "x"), NOW)


@given(policies, st.integers(1, 50), ends)
def test_the_move_follows_the_decision(
    policy: RetryPolicy, attempts: int, ended: AttemptEnded
) -> None:
    decision = decide_retry(policy, attempts, ended, NOW)
    move = retry_move(decision, ended, at_once=Op.RECLAIM, now=NOW)
    assert not isinstance(decision, Uncounted)  # a counted end is never uncounted
    if isinstance(decision, DeadLetter):
        assert (move.op, move.dead_letter_reason, move.detail) == (
            Op.DEAD_LETTER,
            decision.reason,
            decision.detail,
        )
    elif decision.at <= NOW:
        assert (move.op, move.not_before) == (Op.RECLAIM, 0.0)
    else:
        assert (move.op, move.not_before) == (Op.BACKOFF, decision.at)
    changes = move.changes(_task(policy, attempt=attempts, base=1), ended)
    assert (changes["last_error"], "attempts_base" in changes) == ("boom", False)


@given(policies, st.integers(1, 10_000), st.integers(0, 10_000), st.text(max_size=20))
def test_an_undelivered_attempt_is_not_counted_within_the_allowance_whatever_the_budget(
    policy: RetryPolicy, attempt: int, base: int, last_error: str
) -> None:
    # Even the last attempt of a budget, and a task whose policy would back off or dead-letter:
    # nobody ran it, so it spends nothing, starts no backoff and fails nothing.
    attempt = min(attempt, (policy.max_attempts * SHUTDOWN_ALLOWANCE or 100) - 1)
    assert decide_retry(policy, attempt, UNDELIVERED, NOW, total=attempt) == Uncounted()
    task = replace(
        _task(policy, attempt=attempt, base=min(base, attempt - 1)), last_error=last_error
    )
    move = decide_after(task, UNDELIVERED, NOW, at_once=Op.GIVE_BACK)
    assert (move.op, move.not_before, move.dead_letter_reason) == (
        Op.GIVE_BACK,
        0.0,
        DeadLetterReason.NONE,
    )
    after = replace(task, **move.changes(task, UNDELIVERED))
    # attempts_counted is what it was before the claim that started this attempt.
    assert attempts_counted(after) == attempts_counted(task) - 1
    assert after.last_error == last_error  # the last real error stays


SHUTDOWN = AttemptEnded(AttemptEnd.FAILED, "WorkerShutdown: grace ran out", shutdown=True)


@pytest.mark.parametrize("ended", [SHUTDOWN, UNDELIVERED], ids=["shutdown", "undelivered"])
@pytest.mark.parametrize(
    ("max_attempts", "total", "forgiven"),
    [
        (5, 1, True),  # a rolling deploy's give-back: the last counted attempt is not spent
        (5, 19, True),
        (5, 20, False),  # 4 x max_attempts attempts in all: it counts like any failure
        (1, 3, True),
        (1, 4, False),
        (0, 99, True),  # unlimited: 100 in all
        (0, 100, False),
    ],
)
def test_a_give_back_nobody_chose_is_not_counted_within_its_allowance(
    ended: AttemptEnded, max_attempts: int, total: int, forgiven: bool
) -> None:
    """A shutdown give-back, and an undelivered claim: a caller that leaves after every claim
    would otherwise cycle one task for ever, at once, an attempt and its events each time."""
    policy = RetryPolicy(max_attempts=max_attempts)
    counted = min(total, max_attempts) if max_attempts else total
    decision = decide_retry(policy, counted, ended, NOW, key="t", total=total)
    if forgiven:
        assert decision == Uncounted()
    else:
        # Past the allowance: decided as the retryable failure or expiry it then is.
        plain = replace(ended, shutdown=False, end=AttemptEnd.EXPIRED)
        assert decision == decide_retry(policy, counted, plain, NOW, key="t", total=total)
        assert not isinstance(decision, Uncounted)


def test_only_a_retryable_shutdown_failure_is_forgiven() -> None:
    # Anything else says the task, not the worker, failed.
    policy = RetryPolicy(max_attempts=5)
    for other in (replace(SHUTDOWN, retryable=False), replace(SHUTDOWN, end=AttemptEnd.RELEASED)):
        assert not isinstance(decide_retry(policy, 1, other, NOW, total=1), Uncounted)


def test_a_claim_an_epoch_bump_fenced_is_not_counted_within_the_same_allowance() -> None:
    """An operator's rollback drill or version raise fences every held claim; their leases then
    expire. Counted, five drills during one long task dead-lettered it as "lease expired"."""
    assert expired(3, 3) is LEASE_EXPIRED  # a claim of the current epoch: its own expiry
    fenced = expired(2, 3)
    assert (fenced.end, fenced.operator) == (AttemptEnd.EXPIRED, True)
    assert fenced.error == "fenced by the epoch bump to 3 (the claim carried 2)"
    policy = RetryPolicy(max_attempts=5)
    assert decide_retry(policy, 5, fenced, NOW, key="t", total=5) == Uncounted()
    last = decide_retry(policy, 5, fenced, NOW, key="t", total=20)  # past 4 x 5 in all
    assert last == DeadLetter(
        DeadLetterReason.EXHAUSTED, f"all 5 attempts used; last error: {fenced.error}"
    )


def test_decide_after_counts_every_attempt_of_the_task_against_the_allowance() -> None:
    policy = RetryPolicy(max_attempts=2)
    # Attempt 8 of a task whose budget of 2 began after attempt 6: its 2nd counted, 8th in all.
    for attempt, base, op in ((1, 0, Op.FAIL), (7, 5, Op.FAIL), (8, 6, Op.DEAD_LETTER)):
        task = _task(policy, attempt=attempt, base=base)
        move = decide_after(task, SHUTDOWN, NOW, at_once=Op.FAIL)
        assert (move.op, move.uncounted) == (op, op is Op.FAIL), attempt


def _task(policy: RetryPolicy, *, attempt: int, base: int = 0) -> TaskRecord:
    return TaskRecord(
        task_id="t",
        queue="q",
        input_digest="d",
        state=TaskState.CLAIMED,
        attempt=attempt,
        attempts_base=base,
        **policy_fields(policy),
    )


def test_a_task_counts_its_attempts_since_its_budget_began() -> None:
    policy = RetryPolicy(max_attempts=3, initial_backoff=0)
    assert decide_after(_task(policy, attempt=3), LEASE_EXPIRED, NOW, at_once=Op.RECLAIM).op is (
        Op.DEAD_LETTER
    )
    fresh = _task(policy, attempt=3, base=2)  # a RetryTask after attempt 2
    assert decide_after(fresh, LEASE_EXPIRED, NOW, at_once=Op.RECLAIM).op is Op.RECLAIM


def test_a_takeover_is_refused_while_the_policy_delays_or_ends_the_task() -> None:
    def refusal(task: TaskRecord) -> str:
        return takeover(task, task.scheduler_epoch, NOW).refusal

    assert refusal(_task(RetryPolicy(initial_backoff=0), attempt=1)) == ""
    delayed = refusal(_task(RetryPolicy(initial_backoff=5, backoff_jitter=0), attempt=1))
    assert "next attempt in 5 s" in delayed
    used_up = refusal(_task(RetryPolicy(max_attempts=1), attempt=1))
    assert "all 1 attempts used" in used_up


def test_a_takeover_of_an_attempt_an_epoch_bump_fenced_costs_the_task_no_attempt() -> None:
    """The claim that gets to an expired claim before the reclaimer decides as it would: an
    attempt an operator's epoch bump fenced is not counted, even the last of the budget."""
    task = _task(RetryPolicy(max_attempts=1), attempt=1)
    own = takeover(task, task.scheduler_epoch, NOW)
    assert own.ended is LEASE_EXPIRED and "all 1 attempts used" in own.refusal
    fenced = takeover(task, task.scheduler_epoch + 1, NOW)
    assert (fenced.ended, fenced.refusal) == (
        expired(task.scheduler_epoch, task.scheduler_epoch + 1),
        "",
    )
    assert fenced.changes(task)["attempts_base"] == task.attempts_base + 1
    assert "last_error" not in fenced.changes(task)  # the last real error stays


@pytest.mark.parametrize(
    ("policy", "message"),
    [
        (RetryPolicy(max_attempts=-1), "retry_policy.max_attempts must be 0 (unlimited) to"),
        (RetryPolicy(max_attempts=10_001), "retry_policy.max_attempts must be 0 (unlimited) to"),
        (RetryPolicy(initial_backoff=-1), "retry_policy.initial_backoff must be 0 to"),
        (RetryPolicy(max_backoff=float("inf")), "retry_policy.max_backoff must be 0 to"),
        (RetryPolicy(backoff_multiplier=0.5), "retry_policy.backoff_multiplier must be 1 to"),
        (RetryPolicy(initial_backoff=10, max_backoff=5), "must not exceed retry_policy.max_"),
        (RetryPolicy(non_retryable_errors=("E",) * 33), "has 33 codes, the limit is 32"),
        (RetryPolicy(backoff_jitter=1.5), "retry_policy.backoff_jitter must be 0 to 1"),
        (RetryPolicy(backoff_jitter=float("nan")), "retry_policy.backoff_jitter must be 0 to 1"),
    ],
)
def test_a_policy_out_of_bounds_names_its_field(policy: RetryPolicy, message: str) -> None:
    with pytest.raises(InvalidArgument, match=message.replace("(", r"\(").replace(")", r"\)")):
        check_policy(policy, "retry_policy.")


def test_unset_fields_come_from_the_queue_then_the_server() -> None:
    server = RetryPolicy(max_attempts=5, initial_backoff=1)
    defaults = RetryDefaults(server, {"emails": RetryPolicy(max_attempts=2, initial_backoff=1)})
    assert defaults.resolve("emails", {}).max_attempts == 2
    assert defaults.resolve("other", {}).max_attempts == 5
    assert defaults.resolve("emails", {"max_attempts": 0}).max_attempts == 0
    with pytest.raises(InvalidArgument, match=r"retry_policy\.initial_backoff"):
        defaults.resolve("other", {"initial_backoff": 600.0})


def test_a_task_that_sets_its_waits_keeps_them_exactly_and_one_that_does_not_gets_jitter() -> None:
    defaults = RetryDefaults()
    assert defaults.resolve("q", {}) == RetryPolicy(
        max_attempts=5,
        initial_backoff=1.0,
        backoff_multiplier=2.0,
        max_backoff=300.0,
        backoff_jitter=0.2,
    )
    assert defaults.resolve("q", {"max_attempts": 3}).backoff_jitter == 0.2
    for wait in ("initial_backoff", "backoff_multiplier", "max_backoff"):
        exact = defaults.resolve("q", {wait: 10.0})
        assert exact.backoff_jitter == 0.0
        assert exact.delay(2, "t") == exact.backoff(2)
    chosen = defaults.resolve("q", {"initial_backoff": 10.0, "backoff_jitter": 0.5})
    assert chosen.backoff_jitter == 0.5


@given(
    deadline=st.one_of(st.just(0.0), st.floats(NOW - 1000, NOW + 1000)),
    schedule_to_close=st.one_of(st.just(0.0), st.floats(1, 86400)),
)
def test_a_retried_task_gets_a_new_deadline_keeps_a_live_one_and_never_a_passed_one(
    deadline: float, schedule_to_close: float
) -> None:
    task = TaskRecord(
        task_id="t",
        queue="q",
        input_digest="d",
        state=TaskState.FAILED,
        deadline=deadline,
        dead_letter_reason=DeadLetterReason.TIMED_OUT,
    )
    if schedule_to_close:
        assert retried_deadline(task, NOW, schedule_to_close) == NOW + schedule_to_close
    elif deadline and deadline <= NOW:
        with pytest.raises(FailedPrecondition, match="retry it with a new schedule_to_close"):
            retried_deadline(task, NOW, schedule_to_close)
    else:
        assert retried_deadline(task, NOW, schedule_to_close) == deadline


@pytest.mark.parametrize(
    ("policy", "attempt", "op", "counted"),
    [
        (RetryPolicy(max_attempts=2, initial_backoff=0), 7, Op.GIVE_BACK, False),  # 7 < 4 x 2
        (RetryPolicy(max_attempts=2, initial_backoff=0), 8, Op.RECLAIM, True),  # at once
        (RetryPolicy(max_attempts=2, initial_backoff=5), 8, Op.BACKOFF, True),
        (RetryPolicy(max_attempts=1, initial_backoff=0), 4, Op.DEAD_LETTER, True),
    ],
)
def test_an_undelivered_claim_past_the_allowance_moves_as_an_expiry_never_as_a_give_back(
    policy: RetryPolicy, attempt: int, op: Op, counted: bool
) -> None:
    """A ``give_back`` in the log is never a counted attempt (the chaos budget model reads it
    so); past the allowance the move is the one an expired attempt makes. (Every earlier
    attempt was given back uncounted: the budget began with this one.)"""
    move = undelivered_move(_task(policy, attempt=attempt, base=attempt - 1), NOW)
    assert (move.op, move.uncounted) == (op, not counted)
