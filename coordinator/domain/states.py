"""States, outcomes, reasons and the table of legal transitions (pure, no I/O).

The integer values equal the wire enums in protos/coordinator/v1/types.proto, so conversion is
``Enum(proto_value)``; a unit test keeps the two in step.
"""

from __future__ import annotations

from enum import IntEnum, StrEnum


class _Named(IntEnum):
    """An IntEnum whose ``str()`` is its name (``READY``, not ``2``): what people read in logs,
    messages and printed SDK values; comparisons and the wire still use the integer."""

    def __str__(self) -> str:
        return self.name


class TaskState(_Named):
    """Where a task stands (see types.proto for the meaning of each)."""

    WAITING = 1
    READY = 2
    CLAIMED = 3
    REVIEW = 4
    DONE = 5
    CANCELLED = 6
    FAILED = 7
    NEEDS_APPROVAL = 8
    # Waiting out a retry backoff or its not_before: in the delayed index, not the ready index.
    DELAYED = 9


class Outcome(_Named):
    """Typed result of a worker-side call; business outcomes are never exceptions."""

    OK = 1
    CLAIMED = 2
    COMMITTED = 3
    FENCED = 4
    STALE_INPUT = 5
    CANCELLED = 6
    ALREADY_CLAIMED = 7
    STALE_STATE_VERSION = 8
    NOT_CLAIMABLE = 9
    CLAIMS_PAUSED = 10
    NO_READY_TASK = 11
    STALLED = 12
    RENEW_LIMIT = 13
    PAYLOAD_CONFLICT = 14
    NEEDS_APPROVAL = 15
    RECONCILING = 16
    # 17 was TIMED_OUT: reserved. A passed schedule_to_close deadline answers FENCED with
    # FenceReason.DEADLINE_EXCEEDED, so Commit keeps claim.v1's four outcomes.


class FenceReason(_Named):
    """Why a credential is no longer current. 0 means no reason applies."""

    NONE = 0
    SUPERSEDED = 1
    LEASE_EXPIRED = 2
    EPOCH_CHANGED = 3
    RELEASED = 4
    ALREADY_COMMITTED = 5
    TASK_MOVED = 6
    FAILED = 7
    # The task's schedule_to_close deadline passed: no attempt is current any more.
    DEADLINE_EXCEEDED = 8


class AttemptEnd(_Named):
    """How an attempt ended; RUNNING until its claim is closed."""

    RUNNING = 0
    COMMITTED = 1
    RELEASED = 2
    EXPIRED = 3
    CANCELLED = 4
    STALE_INPUT = 5
    FAILED = 6
    TIMED_OUT = 7
    # The claim's answer could not reach its caller (it had left): given back, not counted.
    UNDELIVERED = 8


class DeadLetterReason(IntEnum):
    """Why a task is FAILED (the dead letter); NONE while it is not."""

    NONE = 0
    # Every attempt of its retry policy was used.
    EXHAUSTED = 1
    # Its holder reported a failure no retry can fix (retryable false, or a non-retryable code).
    NON_RETRYABLE = 2
    # Its schedule_to_close deadline passed.
    TIMED_OUT = 3


class WaitingReason(_Named):
    """Why a task is WAITING (domain/waiting.py decides which)."""

    # The task is not WAITING.
    NONE = 0
    # Some upstream is not DONE yet, and none is FAILED or CANCELLED.
    UPSTREAMS_PENDING = 1
    # Some upstream is FAILED or CANCELLED (Task.blocked_by names them): blocked until it is
    # retried and commits, or the edge is removed, or an operator cancels the task.
    UPSTREAM_FAILED = 2


class Op(StrEnum):
    """The operation that caused a transition, recorded in every event."""

    CREATE = "create"
    CLAIM = "claim"
    COMMIT = "commit"
    RELEASE = "release"
    # The holder reported the attempt failed (WorkerService.Fail).
    FAIL = "fail"
    # The task's last attempt ended and no other may follow: FAILED, the dead letter.
    DEAD_LETTER = "dead_letter"
    # An attempt ended and the next one waits out its backoff (DELAYED until then).
    BACKOFF = "backoff"
    # A DELAYED task's time came (the promoter, store/lifecycle/promoter.py).
    PROMOTE = "promote"
    # Created with a not_before in the future.
    CREATE_DELAYED = "create_delayed"
    # An operator sends a FAILED task back to the queue with a fresh attempt budget.
    RETRY = "retry"
    # The task's schedule_to_close deadline passed (store/lifecycle/deadlines.py): FAILED, for a
    # task that can run (a WAITING one is marked overdue instead).
    TIME_OUT = "time_out"
    # A WAITING task's schedule_to_close passed: marked overdue, still WAITING (not a failure:
    # it could not run, so nothing it did failed).
    MARK_OVERDUE = "mark_overdue"
    RECLAIM = "reclaim"
    # A claim whose answer could not reach its caller (it cancelled, its deadline passed) is
    # given back in the next txn: READY again, the attempt not counted
    # (store/attempts/give_back.py).
    GIVE_BACK = "give_back"
    CANCEL = "cancel"
    UPDATE_INPUT = "update_input"
    # Lifecycle (review and dependencies).
    ACCEPT = "accept"
    REJECT = "reject"
    CREATE_WAITING = "create_waiting"
    BLOCK = "block"
    UNBLOCK = "unblock"
    SET_DEPENDENCIES = "set_dependencies"
    # A WAITING task's set of FAILED or CANCELLED upstreams changed (an upstream was
    # dead-lettered or cancelled, or retried): still WAITING, its blocked_by rewritten.
    MARK_BLOCKED = "mark_blocked"
    # Side effects of non-replayable tasks (store/effects/effect.py).
    HOLD_FOR_APPROVAL = "hold_for_approval"
    APPROVE_RETRY = "approve_retry"
    # Owned reconciliation of an UNKNOWN effect past its deadline (store/effects/reconcile.py).
    ESCALATE_RECONCILE = "escalate_reconcile"


# Every legal (from, op) -> to. A transition not listed here is a bug, and the store refuses to
# write it. ``None`` as "from" means the task did not exist. WAITING is entered when a task's
# dependencies are not all DONE (create_waiting, block) and left by unblock
# (store/lifecycle/releaser.py).
# NEEDS_APPROVAL is entered when a claim of a non-replayable task finds an effect an earlier
# attempt left PREPARED or UNKNOWN (hold_for_approval), and left by an admin's approve_retry.
TRANSITIONS: dict[tuple[TaskState | None, Op], TaskState] = {
    (None, Op.CREATE): TaskState.READY,
    (TaskState.READY, Op.CLAIM): TaskState.CLAIMED,
    # Only when the claim key is gone (lease expired): checked by the claim decision.
    (TaskState.CLAIMED, Op.CLAIM): TaskState.CLAIMED,
    (TaskState.CLAIMED, Op.COMMIT): TaskState.DONE,
    (TaskState.CLAIMED, Op.RELEASE): TaskState.READY,
    (TaskState.CLAIMED, Op.FAIL): TaskState.READY,
    (TaskState.CLAIMED, Op.DEAD_LETTER): TaskState.FAILED,
    # Retry policy (domain/retry.py): the end of an attempt may wait out a backoff first; the
    # promoter moves a DELAYED task on when its time comes. FAILED is left only by an
    # operator's RetryTask.
    (TaskState.CLAIMED, Op.BACKOFF): TaskState.DELAYED,
    (None, Op.CREATE_DELAYED): TaskState.DELAYED,
    (TaskState.DELAYED, Op.PROMOTE): TaskState.READY,
    (TaskState.DELAYED, Op.CANCEL): TaskState.CANCELLED,
    (TaskState.DELAYED, Op.UPDATE_INPUT): TaskState.DELAYED,
    (TaskState.FAILED, Op.RETRY): TaskState.READY,
    # schedule_to_close: past it no result is wanted any more from a task that can run. A
    # WAITING task could not run, so its deadline is no business failure: it is marked overdue
    # and keeps waiting (domain/waiting.py).
    (TaskState.WAITING, Op.MARK_OVERDUE): TaskState.WAITING,
    (TaskState.READY, Op.TIME_OUT): TaskState.FAILED,
    (TaskState.CLAIMED, Op.TIME_OUT): TaskState.FAILED,
    (TaskState.DELAYED, Op.TIME_OUT): TaskState.FAILED,
    (TaskState.NEEDS_APPROVAL, Op.TIME_OUT): TaskState.FAILED,
    (TaskState.CLAIMED, Op.RECLAIM): TaskState.READY,
    # The claim's answer never left the server: the task goes back where it stood.
    (TaskState.CLAIMED, Op.GIVE_BACK): TaskState.READY,
    (TaskState.READY, Op.CANCEL): TaskState.CANCELLED,
    (TaskState.CLAIMED, Op.CANCEL): TaskState.CANCELLED,
    (TaskState.REVIEW, Op.CANCEL): TaskState.CANCELLED,
    (TaskState.READY, Op.UPDATE_INPUT): TaskState.READY,
    (TaskState.CLAIMED, Op.UPDATE_INPUT): TaskState.READY,
    # Review: only a reviewer other than the executor moves a REVIEW task on
    # (store/lifecycle/review.py).
    (TaskState.REVIEW, Op.ACCEPT): TaskState.DONE,
    # A rejection opens a new round: revision + 1, READY; the old result stays in history.
    (TaskState.REVIEW, Op.REJECT): TaskState.READY,
    # Dependencies (store/lifecycle/dependencies.py, store/lifecycle/releaser.py): "not ready" is
    # not "failed".
    (None, Op.CREATE_WAITING): TaskState.WAITING,
    (TaskState.READY, Op.BLOCK): TaskState.WAITING,
    (TaskState.WAITING, Op.UNBLOCK): TaskState.READY,
    (TaskState.READY, Op.SET_DEPENDENCIES): TaskState.READY,
    (TaskState.WAITING, Op.SET_DEPENDENCIES): TaskState.WAITING,
    # An upstream FAILED or CANCELLED blocks its dependents, visibly, without ending them: a
    # retried upstream may still commit (store/lifecycle/releaser.py). Ending them is an operator's
    # CancelTask with cascade.
    (TaskState.WAITING, Op.MARK_BLOCKED): TaskState.WAITING,
    (TaskState.WAITING, Op.CANCEL): TaskState.CANCELLED,
    (TaskState.WAITING, Op.UPDATE_INPUT): TaskState.WAITING,
    # Non-replayable tasks (store/effects/effect.py): a claim that finds an uncertain effect of an
    # earlier attempt parks the task (from READY, or from CLAIMED whose lease expired).
    (TaskState.READY, Op.HOLD_FOR_APPROVAL): TaskState.NEEDS_APPROVAL,
    (TaskState.CLAIMED, Op.HOLD_FOR_APPROVAL): TaskState.NEEDS_APPROVAL,
    (TaskState.NEEDS_APPROVAL, Op.APPROVE_RETRY): TaskState.READY,
    (TaskState.NEEDS_APPROVAL, Op.CANCEL): TaskState.CANCELLED,
    # Owned reconciliation (store/effects/reconcile.py): an UNKNOWN effect still unresolved at its
    # deadline parks the task for a human (from READY, or from CLAIMED whose claim ended).
    (TaskState.READY, Op.ESCALATE_RECONCILE): TaskState.NEEDS_APPROVAL,
    (TaskState.CLAIMED, Op.ESCALATE_RECONCILE): TaskState.NEEDS_APPROVAL,
}

# A committed task with requires_review goes to REVIEW instead of DONE.
REVIEW_ON_COMMIT: tuple[TaskState, Op] = (TaskState.CLAIMED, Op.COMMIT)
TRANSITIONS_WITH_REVIEW: dict[tuple[TaskState | None, Op], TaskState] = {
    **TRANSITIONS,
    REVIEW_ON_COMMIT: TaskState.REVIEW,
}

TERMINAL_STATES = frozenset({TaskState.DONE, TaskState.CANCELLED, TaskState.FAILED})

# States in which the task's current revision may still get its canonical commit.
UNCOMMITTED_STATES = frozenset(
    {
        TaskState.WAITING,
        TaskState.READY,
        TaskState.CLAIMED,
        TaskState.NEEDS_APPROVAL,
        TaskState.DELAYED,
    }
)


class IllegalTransition(Exception):
    """A transition outside the table was attempted: a bug, never a user error."""


def next_state(current: TaskState | None, op: Op, *, requires_review: bool = False) -> TaskState:
    """The state ``op`` leads to from ``current``, or IllegalTransition."""
    table = TRANSITIONS_WITH_REVIEW if requires_review else TRANSITIONS
    try:
        return table[(current, op)]
    except KeyError:
        name = current.name if current is not None else "(none)"
        raise IllegalTransition(f"no transition {name} --{op.value}-->") from None


def is_legal(current: TaskState | None, op: Op) -> bool:
    """Whether ``op`` may be applied to a task in ``current``."""
    return (current, op) in TRANSITIONS
