"""What the checker reports about: the final tasks, and the violations it finds."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from chaos.history import Operation
from coordinator.domain.states import DeadLetterReason, TaskState

SETTLED = "settled"
"""Reason of indefinite commits the checker settled from the final state (no log)."""


@dataclass(frozen=True)
class FinalTask:
    """A task as etcd holds it after the run."""

    task_id: str
    state: TaskState
    revision: int = 0
    result_commit_id: str = ""  # "{attempt_id}@{generation}" of the canonical commit
    # Its retry policy's budget (0: unlimited, or not known), the attempts counted against it,
    # and why it is FAILED (NONE while it is not).
    max_attempts: int = 0
    attempts_counted: int = 0
    dead_letter_reason: DeadLetterReason = DeadLetterReason.NONE

    @property
    def dead_lettered(self) -> bool:
        """Whether it ended as the retry policy allows a task to fail: FAILED for an exhausted
        budget, with every attempt of the budget counted."""
        return (
            self.state is TaskState.FAILED
            and self.dead_letter_reason is DeadLetterReason.EXHAUSTED
            and 0 < self.max_attempts == self.attempts_counted
        )


class Rule(StrEnum):
    """The rules the checker reports broken."""

    # What clients heard, in real-time order (chaos/model.py ``step``).
    DOUBLE_COMMIT = "double-commit"
    LATE_WRITE_NOT_FENCED = "late-write-not-fenced"
    GENERATION_NOT_INCREASING = "generation-not-increasing"
    OLD_EPOCH_NOT_FENCED = "old-epoch-not-fenced"
    # Against etcd's final state.
    ACKNOWLEDGED_COMMIT_LOST = "acknowledged-commit-lost"
    STALE_RESULT = "stale-result"
    LOST_TASK = "lost-task"
    # The retry budget and the dead letter (chaos/budget.py, chaos/model.py ``spend``).
    CLAIM_BEYOND_BUDGET = "claim-beyond-budget"
    WRITE_AFTER_DEAD_LETTER = "write-after-dead-letter"
    DEAD_LETTER_BEFORE_BUDGET = "dead-letter-before-budget"
    DEAD_LETTER_MISSING = "dead-letter-missing"
    # Against etcd's own history (chaos/linearizability.py).
    REFUSED_CALL_TOOK_EFFECT = "refused-call-took-effect"
    ACKNOWLEDGED_CALL_NOT_IN_LOG = "acknowledged-call-not-in-log"
    LOG_DISAGREES_WITH_FINAL_STATE = "log-disagrees-with-final-state"
    LOG_NOT_LINEARIZABLE = "log-not-linearizable"
    REAL_TIME_ORDER = "real-time-order"
    # What a WatchEvents follower received, against etcd's history (chaos/follow_check.py).
    FOLLOWER_GAP = "follower-gap"
    FOLLOWER_DUPLICATE = "follower-duplicate"
    FOLLOWER_OUT_OF_ORDER = "follower-out-of-order"
    FOLLOWER_UNKNOWN_EVENT = "follower-unknown-event"
    # A stream refused otherwise than RESOURCE_EXHAUSTED (the abuse scenario's flood).
    STREAM_REFUSED_WRONGLY = "stream-refused-wrongly"
    # A stream nobody read that the server did not end by a bound (the abuse scenario).
    UNREAD_STREAM_NOT_ENDED = "unread-stream-not-ended"
    # A claim nobody received (the long-poll-cancel scenario, chaos/delivery_check.py).
    UNDELIVERED_ATTEMPT_COUNTED = "undelivered-attempt-counted"
    DELIVERED_CLAIM_GIVEN_BACK = "delivered-claim-given-back"
    # The downstream's counts and the replicas' counters.
    DUPLICATE_EFFECT = "duplicate-effect"
    FENCE_COVERAGE = "fence-coverage"


@dataclass(frozen=True)
class Violation:
    """A broken rule, the task it concerns, and the operations involved."""

    rule: Rule
    task: str
    ops: tuple[str, ...]
    detail: str

    def __str__(self) -> str:
        return f"{self.rule} on {self.task or '-'}: {self.detail} [{', '.join(self.ops)}]"


def commit_id(op: Operation) -> str:
    """The ``attempt_id@generation`` a commit by ``op``'s attempt would leave behind."""
    return f"{op.attempt_id}@{op.generation}"
