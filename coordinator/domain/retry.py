"""The retry policy and the one decision every attempt end goes through (pure, no I/O).

An attempt that ends without a result - its lease expired (stalled and renew-limited claims
end this way too), its holder released it, or its holder reported a failure - asks
``decide_retry``: another attempt, no earlier than its backoff (``Requeue``), or none, and the
task is FAILED, the dead letter (``DeadLetter``). The reclaimer, a claim that takes over an
expired attempt, Release and Fail all call it, so one rule decides for all of them. An attempt
whose claim answer never reached its caller (UNDELIVERED, store/attempts/give_back.py) asks it too,
and is always ``Uncounted``: nobody ran it, so it spends nothing of the budget and waits no backoff.

A task's policy is resolved when it is created (its own fields, else its queue's, else the
server's: ``RetryDefaults.resolve``) and stored with the task, so every replica decides alike
whatever its configuration.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any

from coordinator.domain.records import TaskRecord
from coordinator.domain.states import AttemptEnd, DeadLetterReason, Op
from coordinator.errors import FailedPrecondition, InvalidArgument

MAX_ATTEMPTS = 10_000
MAX_BACKOFF = 7 * 86400.0
MAX_MULTIPLIER = 100.0
MAX_NON_RETRYABLE = 32
MAX_JITTER = 1.0


@dataclass(frozen=True)
class RetryPolicy:
    """How many attempts a task gets and how far apart they start.

    ``max_attempts`` counts every attempt of the task (since its creation, a new input or a
    RetryTask), 0 meaning unlimited; the n-th retry waits ``initial_backoff *
    backoff_multiplier ** (n - 1)`` seconds, at most ``max_backoff``, lengthened by up to
    ``backoff_jitter`` of itself (``delay``); a failure whose error code is in
    ``non_retryable_errors`` is never retried.

    The defaults forgive a bad deploy: a handler that fails every time spends 1 + 2 + 4 + 8 =
    15 s or more before its 5th attempt fails, not the milliseconds of back-to-back retries
    (which dead-lettered a whole queue in under a second), and the jitter keeps the tasks that
    failed together from all coming back in the same instant.
    """

    max_attempts: int = 5
    initial_backoff: float = 1.0
    backoff_multiplier: float = 2.0
    max_backoff: float = 300.0
    non_retryable_errors: tuple[str, ...] = ()
    backoff_jitter: float = 0.2

    def backoff(self, attempts: int) -> float:
        """Seconds to wait after ``attempts`` attempts (>= 1) before the next one starts."""
        if self.initial_backoff <= 0:
            return 0.0
        # Computed in logs so a large attempt count never overflows a float.
        exponent = max(attempts - 1, 0)
        if self.backoff_multiplier > 1 and exponent * math.log(self.backoff_multiplier) > 50:
            return self.max_backoff
        return min(self.max_backoff, self.initial_backoff * self.backoff_multiplier**exponent)

    def delay(self, attempts: int, key: str) -> float:
        """``backoff(attempts)`` lengthened by ``backoff_jitter`` times a fraction in [0, 1)
        drawn from ``key`` (the task id) and ``attempts``: the same task and attempt always get
        the same wait, so a decision replays alike on every replica and in tests, while tasks
        that failed together spread out. Applied after the cap, so waits at max_backoff spread
        too (up to max_backoff * (1 + backoff_jitter))."""
        base = self.backoff(attempts)
        if base <= 0 or self.backoff_jitter <= 0:
            return base
        return base * (1.0 + self.backoff_jitter * jitter_fraction(key, attempts))


def jitter_fraction(key: str, attempts: int) -> float:
    """A fraction in [0, 1) fixed by ``key`` and ``attempts`` (sha256: uniform, and the same
    in every process, which Python's salted ``hash`` is not)."""
    digest = hashlib.sha256(f"{key}#{attempts}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2.0**64


def check_policy(policy: RetryPolicy, prefix: str = "") -> None:
    """InvalidArgument naming the field (with ``prefix``) when a bound is broken."""
    if not 0 <= policy.max_attempts <= MAX_ATTEMPTS:
        raise InvalidArgument(
            f"{prefix}max_attempts must be 0 (unlimited) to {MAX_ATTEMPTS}, "
            f"got {policy.max_attempts}"
        )
    for key, value in (
        ("initial_backoff", policy.initial_backoff),
        ("max_backoff", policy.max_backoff),
    ):
        if not (math.isfinite(value) and 0 <= value <= MAX_BACKOFF):
            raise InvalidArgument(f"{prefix}{key} must be 0 to {MAX_BACKOFF:g} s, got {value}")
    multiplier = policy.backoff_multiplier
    if not (math.isfinite(multiplier) and 1 <= multiplier <= MAX_MULTIPLIER):
        raise InvalidArgument(
            f"{prefix}backoff_multiplier must be 1 to {MAX_MULTIPLIER:g}, got {multiplier}"
        )
    jitter = policy.backoff_jitter
    if not (math.isfinite(jitter) and 0 <= jitter <= MAX_JITTER):
        raise InvalidArgument(f"{prefix}backoff_jitter must be 0 to {MAX_JITTER:g}, got {jitter}")
    if policy.initial_backoff > policy.max_backoff:
        raise InvalidArgument(
            f"{prefix}initial_backoff ({policy.initial_backoff:g} s) must not exceed "
            f"{prefix}max_backoff ({policy.max_backoff:g} s)"
        )
    codes = policy.non_retryable_errors
    if len(codes) > MAX_NON_RETRYABLE:
        raise InvalidArgument(
            f"{prefix}non_retryable_errors has {len(codes)} codes, the limit is {MAX_NON_RETRYABLE}"
        )


_WAITS = frozenset({"initial_backoff", "backoff_multiplier", "max_backoff"})


@dataclass(frozen=True)
class RetryDefaults:
    """The policy a task gets for the fields it leaves unset: its queue's, else the server's."""

    server: RetryPolicy = RetryPolicy()
    queues: Mapping[str, RetryPolicy] = field(default_factory=lambda: MappingProxyType({}))

    def for_queue(self, queue: str) -> RetryPolicy:
        """The default policy of ``queue``."""
        return self.queues.get(queue, self.server)

    def resolve(self, queue: str, overrides: Mapping[str, Any]) -> RetryPolicy:
        """The policy of a new task of ``queue`` that set the fields in ``overrides``;
        InvalidArgument naming the request field when the result breaks a bound.

        A task that sets any of its waits (initial_backoff, backoff_multiplier, max_backoff)
        and not backoff_jitter gets no jitter: it waits exactly what it asked for, as it did
        before jitter existed. Jitter spreads the waits nobody chose."""
        if _WAITS & overrides.keys() and "backoff_jitter" not in overrides:
            overrides = {**overrides, "backoff_jitter": 0.0}
        policy = replace(self.for_queue(queue), **overrides)
        check_policy(policy, "retry_policy.")
        return policy


def policy_of(task: TaskRecord) -> RetryPolicy:
    """The policy stored with ``task`` at its creation."""
    return RetryPolicy(
        max_attempts=task.max_attempts,
        initial_backoff=task.initial_backoff,
        backoff_multiplier=task.backoff_multiplier,
        max_backoff=task.max_backoff,
        non_retryable_errors=task.non_retryable_errors,
        backoff_jitter=task.backoff_jitter,
    )


def policy_fields(policy: RetryPolicy) -> dict[str, Any]:
    """The TaskRecord fields that store ``policy``."""
    return {
        "max_attempts": policy.max_attempts,
        "initial_backoff": policy.initial_backoff,
        "backoff_multiplier": policy.backoff_multiplier,
        "max_backoff": policy.max_backoff,
        "non_retryable_errors": policy.non_retryable_errors,
        "backoff_jitter": policy.backoff_jitter,
    }


def attempts_counted(task: TaskRecord) -> int:
    """Attempts of ``task`` counted against its max_attempts (since its budget began)."""
    return task.attempt - task.attempts_base


def retried_deadline(task: TaskRecord, now: float, schedule_to_close: float) -> float:
    """The deadline of ``task`` sent back to the queue at ``now`` (RetryTask): ``now +
    schedule_to_close`` when one is given, else its own (0: none). FailedPrecondition when its
    own has passed and no new one is given: the task would be refused every claim and fail
    TIMED_OUT again at the next deadline pass, so the retry could never run."""
    if schedule_to_close:
        return now + schedule_to_close
    if task.deadline and task.deadline <= now:
        reason = task.dead_letter_reason.name
        raise FailedPrecondition(
            f"task {task.task_id!r} ({reason}) has a schedule_to_close deadline that passed "
            f"{now - task.deadline:.0f} s ago; retry it with a new schedule_to_close (from now)"
        )
    return task.deadline


COUNTED_ENDS = frozenset({AttemptEnd.EXPIRED, AttemptEnd.RELEASED, AttemptEnd.FAILED})
"""Attempt ends that ask for another attempt. A commit, a cancel and an input change end an
attempt too, but the task does not go back to the queue by the retry policy after them."""
UNCOUNTED_ENDS = frozenset({AttemptEnd.UNDELIVERED})
"""Attempt ends that send the task back without counting the attempt, within SHUTDOWN_ALLOWANCE:
no worker ever held it (its claim answer could not be delivered), so it is no try of the task.
Past the allowance it counts: a caller that leaves after every claim it makes (a deadline that
always runs out just then, a crash between claim and answer, or on purpose) would otherwise
cycle one task for ever, at once and without backoff, an attempt and its events each time."""


@dataclass(frozen=True)
class AttemptEnded:
    """An attempt that ended without a result, as the retry decision sees it."""

    end: AttemptEnd
    # What ended it, for the events: "lease expired", "released: ...", "TimeoutError: ...".
    error: str
    # Reported by the holder (Fail): another attempt may succeed; its error code; the earliest
    # it wants the next attempt to start (seconds after the end).
    retryable: bool = True
    code: str = ""
    delay: float = 0.0
    # The holder gave the task back because it was shutting down (FailRequest.shutdown).
    shutdown: bool = False
    # An operator's epoch bump (a rollback, a version raise) fenced the claim before it ended.
    operator: bool = False


SHUTDOWN_ALLOWANCE = 4
"""A shutdown give-back (or an undelivered claim, or a claim an epoch bump fenced) is not counted
while the task has had fewer than this many times its max_attempts attempts in all (counted or
not): a rolling deploy of a pool costs a long task no attempt, and a worker that says "shutting
down" on every claim cannot keep one alive for ever."""
SHUTDOWN_ALLOWANCE_UNLIMITED = 100
"""The same bound for a task whose max_attempts is 0 (unlimited)."""

LEASE_EXPIRED = AttemptEnded(AttemptEnd.EXPIRED, "lease expired")
"""The end of an attempt whose lease expired (stalled and renew-limited claims end so too)."""
UNDELIVERED = AttemptEnded(AttemptEnd.UNDELIVERED, "the claim's answer could not be delivered")
"""The end of an attempt whose claim answer could not reach its caller (it had left)."""
UNDELIVERED_COUNTED = "(undelivered past the allowance: counted)"
"""Ends the detail of the event that gives back an undelivered claim past SHUTDOWN_ALLOWANCE (a
retry, a backoff or the dead letter, not a ``give_back``), so a reader of the log knows it."""


def expired(claim_epoch: int, epoch: int) -> AttemptEnded:
    """The end of an attempt whose claim key is gone, its claim made at ``claim_epoch`` and
    the scheduler now at ``epoch``: LEASE_EXPIRED, or, when an epoch bump fenced the claim
    first (an operator's rollback or version raise), an end that is not the task's doing and
    is not counted within SHUTDOWN_ALLOWANCE, like a shutdown give-back."""
    if claim_epoch >= epoch:
        return LEASE_EXPIRED
    why = f"fenced by the epoch bump to {epoch} (the claim carried {claim_epoch})"
    return AttemptEnded(AttemptEnd.EXPIRED, why, operator=True)


@dataclass(frozen=True)
class Requeue:
    """Another attempt, claimable from ``at`` (at or before the end: at once)."""

    at: float


@dataclass(frozen=True)
class DeadLetter:
    """No other attempt: the task is FAILED for ``reason``; ``detail`` says so for people."""

    reason: DeadLetterReason
    detail: str


@dataclass(frozen=True)
class Uncounted:
    """The attempt never reached a worker: claimable again at once, not counted, no backoff."""


RetryDecision = Requeue | DeadLetter | Uncounted
"""One case per thing the task can become after an attempt ended without a result."""


def decide_retry(
    policy: RetryPolicy,
    attempts: int,
    ended: AttemptEnded,
    now: float,
    *,
    key: str = "",
    total: int = 0,
) -> RetryDecision:
    """What follows an attempt that ended without a result at ``now``, the task having had
    ``attempts`` attempts (this one included) counted against ``policy`` and ``total`` in all;
    ``key`` (the task id) draws the backoff's jitter."""
    if _forgiven(policy, ended, total):
        # Before any budget or non-retryable check: an attempt nobody ran (or that its worker
        # gave back as it stopped, or an operator fenced) can exhaust nothing, even the last
        # one of its budget.
        return Uncounted()
    if ended.end not in COUNTED_ENDS | UNCOUNTED_ENDS:
        raise ValueError(f"an attempt ended {ended.end.name} is not retried by the policy")
    plural = "attempt" if attempts == 1 else "attempts"
    if not ended.retryable or ended.code in policy.non_retryable_errors:
        return DeadLetter(
            DeadLetterReason.NON_RETRYABLE,
            f"non-retryable failure after {attempts} {plural}; last error: {ended.error}",
        )
    if policy.max_attempts and attempts >= policy.max_attempts:
        return DeadLetter(
            DeadLetterReason.EXHAUSTED,
            f"all {policy.max_attempts} attempts used; last error: {ended.error}",
        )
    return Requeue(now + max(policy.delay(attempts, key), ended.delay))


def _forgiven(policy: RetryPolicy, ended: AttemptEnded, total: int) -> bool:
    """Whether ``ended`` is an undelivered claim, a shutdown give-back or an attempt an
    operator's epoch bump fenced, within the allowance (SHUTDOWN_ALLOWANCE)."""
    shutdown = ended.shutdown and ended.retryable and ended.end is AttemptEnd.FAILED
    operator = ended.operator and ended.end is AttemptEnd.EXPIRED
    if not (shutdown or operator or ended.end in UNCOUNTED_ENDS):
        return False
    most = policy.max_attempts * SHUTDOWN_ALLOWANCE or SHUTDOWN_ALLOWANCE_UNLIMITED
    return total < most


@dataclass(frozen=True)
class RetryMove:
    """The transition a retry decision makes: its op, the record changes and the event detail."""

    op: Op
    detail: str
    not_before: float = 0.0
    dead_letter_reason: DeadLetterReason = DeadLetterReason.NONE
    # The ended attempt is not counted against the policy (``Uncounted``).
    uncounted: bool = False

    def changes(self, task: TaskRecord, ended: AttemptEnded) -> dict[str, Any]:
        """The fields of ``task`` (whose attempt ended as ``ended``) this move sets."""
        if self.uncounted:
            # The budget begins one attempt later, so attempts_counted is what it was before
            # the claim; last_error stays the last real error (an undelivered answer is none).
            return {
                "not_before": 0.0,
                "dead_letter_reason": DeadLetterReason.NONE,
                "attempts_base": task.attempts_base + 1,
            }
        return {
            "not_before": self.not_before,
            "last_error": ended.error,
            "last_error_code": ended.code,
            "dead_letter_reason": self.dead_letter_reason,
        }


def retry_move(
    decision: RetryDecision, ended: AttemptEnded, *, at_once: Op, now: float
) -> RetryMove:
    """The move for ``decision``: ``at_once`` (to READY) when the next attempt may start now,
    BACKOFF (to DELAYED until it may) or DEAD_LETTER (to FAILED)."""
    if isinstance(decision, Uncounted):
        return RetryMove(at_once, ended.error, uncounted=True)
    if isinstance(decision, DeadLetter):
        return RetryMove(Op.DEAD_LETTER, decision.detail, dead_letter_reason=decision.reason)
    if decision.at <= now:
        return RetryMove(at_once, ended.error)
    return RetryMove(
        Op.BACKOFF, f"{ended.error}; next attempt in {decision.at - now:.3g} s", decision.at
    )


def decide_after(task: TaskRecord, ended: AttemptEnded, now: float, *, at_once: Op) -> RetryMove:
    """``decide_retry`` on ``task``'s own policy and attempt count, as the move to write."""
    return retry_move(_decision(task, ended, now), ended, at_once=at_once, now=now)


def undelivered_move(task: TaskRecord, now: float) -> RetryMove:
    """The move that gives back ``task``'s undelivered claim: GIVE_BACK, uncounted, within the
    allowance; past it the move an expired attempt makes (RECLAIM at once, a backoff or the
    dead letter), counted. So a ``give_back`` in the log is never a counted attempt."""
    decision = _decision(task, UNDELIVERED, now)
    at_once = Op.GIVE_BACK if isinstance(decision, Uncounted) else Op.RECLAIM
    return retry_move(decision, UNDELIVERED, at_once=at_once, now=now)


def _decision(task: TaskRecord, ended: AttemptEnded, now: float) -> RetryDecision:
    """``decide_retry`` on ``task``'s own policy, counted attempts and attempts in all."""
    return decide_retry(
        policy_of(task), attempts_counted(task), ended, now, key=task.task_id, total=task.attempt
    )


@dataclass(frozen=True)
class Takeover:
    """A claim that takes over the expired attempt of a CLAIMED task (its claim key gone before
    the reclaimer got there): how that attempt ended and the retry decision on it, as the
    reclaimer would have made it. The claim writes the decision's record changes, so an attempt
    an operator's epoch bump fenced costs the task no attempt by either path."""

    ended: AttemptEnded
    move: RetryMove

    @property
    def refusal(self) -> str:
        """Why the claim may not take over ("" when it may): the policy delays the next
        attempt or allows none, which the reclaimer writes."""
        if self.move.op is Op.RECLAIM:
            return ""
        detail = self.move.detail
        return f"the expired attempt's retry policy does not allow a new attempt now ({detail})"

    def changes(self, task: TaskRecord) -> dict[str, Any]:
        """The fields of ``task`` the claim sets for the attempt it closes."""
        return self.move.changes(task, self.ended)


def takeover(task: TaskRecord, epoch: int, now: float) -> Takeover:
    """A takeover at ``now`` of CLAIMED ``task``'s expired attempt, the scheduler at ``epoch``."""
    ended = expired(task.scheduler_epoch, epoch)
    return Takeover(ended, decide_after(task, ended, now, at_once=Op.RECLAIM))
