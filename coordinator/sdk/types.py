"""The worker SDK's value types: the fence, typed call results, task views and its exceptions.

Every result is a frozen dataclass built from the wire message (``from_proto``); outcomes and
reasons are the domain IntEnums, whose values equal the wire enums. Business outcomes (FENCED,
CANCELLED, ...) are results, never exceptions; exceptions mean a broken call or a lost claim.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from enum import StrEnum
from typing import Self

from google.protobuf.timestamp_pb2 import Timestamp

from coordinator.domain.decisions import Fence
from coordinator.domain.states import (
    FenceReason,
    Outcome,
    TaskState,
)
from coordinator.errors import CoordinatorError
from coordinator.v1 import types_pb2, worker_pb2


class TransportError(CoordinatorError):
    """The coordinator did not answer (UNAVAILABLE / DEADLINE_EXCEEDED), or refused to run the
    call at its concurrency bound (RESOURCE_EXHAUSTED), for the whole retry budget.

    Raised as itself only when no try of the call reached a coordinator (every one failed to
    connect or was refused unrun): nothing happened. When a try may have reached one,
    OutcomeUnknown is raised.
    """

    def __init__(self, message: str, *, code: str) -> None:
        super().__init__(message)
        self.code = code


class OutcomeUnknown(TransportError):
    """The SDK gave up on a call that may have reached the coordinator and taken effect.

    Not a failure: a commit that landed while its answer was lost is canonical. Every worker
    call is idempotent per attempt, so repeating the same call (same claim, same result; same
    task id or idempotency key for a create) answers what really happened: a repeated commit
    answers COMMITTED if the first one landed. The message says what to repeat.
    """


class NotSupported(CoordinatorError):
    """The coordinator does not offer this call (UNIMPLEMENTED: an older version)."""


class LossSource(StrEnum):
    """Which observation told the SDK that a claim was lost."""

    RENEW = "renew"
    COMMIT = "commit"
    AUTHORIZE = "authorize"
    RELEASE = "release"
    FAIL = "fail"
    # A PrepareEffect or RecordEffect answered FENCED, CANCELLED or STALE_INPUT.
    EFFECT = "effect"
    # The lease ran out by the local monotonic clock while renewals could not reach the server.
    LOCAL_EXPIRY = "local_expiry"
    # The server refused a renewal with an error (NOT_FOUND, PERMISSION_DENIED, ...).
    ERROR = "error"
    # A StartJob (managed job, sdk/managed.py) answered FENCED, CANCELLED or STALE_INPUT.
    JOB = "job"
    # A StageResult was refused: the task's deadline passed (FENCED, DEADLINE_EXCEEDED).
    STAGE = "stage"


@dataclass(frozen=True)
class LostReason:
    """Why a claim is lost: the outcome and fence reason that lost it, and who saw it."""

    outcome: Outcome
    reason: FenceReason
    message: str
    source: LossSource
    # The claim's task, so one callback can serve many claims (a pool's batch of claims).
    task_id: str = ""

    def __str__(self) -> str:
        reason = f"/{self.reason.name}" if self.reason is not FenceReason.NONE else ""
        return f"{self.outcome.name}{reason} ({self.source.value}): {self.message}"


class ClaimLost(CoordinatorError):
    """The claim no longer holds its task (or is about to lose it): stop working on it.

    ``reason`` is None when the claim is still held but has less time left than the safety margin.
    """

    def __init__(self, message: str, *, reason: LostReason | None = None) -> None:
        super().__init__(message)
        self.reason = reason


def outcome_of(value: int) -> Outcome:
    """The domain Outcome of a wire value; OUTCOME_UNSPECIFIED is a server bug, not a result."""
    try:
        return Outcome(value)
    except ValueError:
        raise CoordinatorError(f"the server answered with outcome {value}") from None


def timestamp(ts: Timestamp) -> datetime | None:
    """A wire timestamp as an aware UTC datetime; None when unset."""
    return utc(ts.seconds, ts.nanos)


def utc(seconds: int, nanos: int) -> datetime | None:
    """The fields of a wire timestamp as an aware UTC datetime; None when both are zero."""
    if seconds == 0 and nanos == 0:
        return None
    return datetime.fromtimestamp(seconds + nanos / 1e9, tz=UTC)


def fence_from_proto(msg: types_pb2.Fence) -> Fence:
    """The credential of one claim, from the wire; every worker-side call sends it back
    unchanged (the fence is the domain's value: one class on both sides of the wire)."""
    return Fence(
        task_id=msg.task_id,
        attempt_id=msg.attempt_id,
        claim_generation=msg.claim_generation,
        scheduler_epoch=msg.scheduler_epoch,
        cancel_generation=msg.cancel_generation,
    )


def fence_to_proto(fence: Fence) -> types_pb2.Fence:
    """The wire message of ``fence``."""
    return types_pb2.Fence(
        task_id=fence.task_id,
        attempt_id=fence.attempt_id,
        claim_generation=fence.claim_generation,
        scheduler_epoch=fence.scheduler_epoch,
        cancel_generation=fence.cancel_generation,
    )


@dataclass(frozen=True)
class ClaimRefused:
    """A claim that did not succeed; the caller got no credential."""

    outcome: Outcome
    reason: FenceReason
    message: str
    # The task's state_version at the refusal (after STALE_STATE_VERSION: the one to expect).
    state_version: int = 0

    @classmethod
    def from_proto(cls, msg: worker_pb2.ClaimResponse) -> Self:
        """Build from a ClaimResponse whose outcome is not CLAIMED."""
        return cls(outcome_of(msg.outcome), FenceReason(msg.reason), msg.message, msg.state_version)


@dataclass(frozen=True)
class CommitOutcome:
    """The answer to a commit: COMMITTED, or FENCED / STALE_INPUT / CANCELLED with a reason."""

    outcome: Outcome
    reason: FenceReason = FenceReason.NONE
    message: str = ""
    # "{attempt_id}@{claim_generation}" of the canonical commit, when COMMITTED.
    result_commit_id: str = ""
    state: TaskState | None = None

    @property
    def committed(self) -> bool:
        """Whether the result is canonical for the task revision."""
        return self.outcome is Outcome.COMMITTED

    @classmethod
    def from_proto(cls, msg: worker_pb2.CommitResponse) -> Self:
        """Build from the wire message."""
        return cls(
            outcome=outcome_of(msg.outcome),
            reason=FenceReason(msg.reason),
            message=msg.message,
            result_commit_id=msg.result_commit_id,
            state=TaskState(msg.state) if msg.state else None,
        )


@dataclass(frozen=True)
class ToolAuthorization:
    """The answer of a tool acceptance point; truthy only when the side effect may run."""

    outcome: Outcome
    reason: FenceReason = FenceReason.NONE
    message: str = ""

    @property
    def allowed(self) -> bool:
        """Whether the fence held: the tool may run its side effect now."""
        return self.outcome is Outcome.OK

    def __bool__(self) -> bool:
        return self.allowed


@dataclass(frozen=True)
class StageOutcome:
    """The answer to a stage: OK (``current`` says whether the claim was still held), or
    FENCED with reason DEADLINE_EXCEEDED once the task's deadline passed (nothing staged)."""

    outcome: Outcome
    current: bool
    message: str = ""
    reason: FenceReason = FenceReason.NONE

    @property
    def staged(self) -> bool:
        """Whether the result was written to the attempt's staging area."""
        return self.outcome is Outcome.OK


@dataclass(frozen=True)
class ReleaseOutcome:
    """The answer to a release: OK, or FENCED / CANCELLED when the claim was gone already."""

    outcome: Outcome
    reason: FenceReason = FenceReason.NONE
    message: str = ""

    @property
    def released(self) -> bool:
        """Whether this call gave the task back."""
        return self.outcome is Outcome.OK


@dataclass(frozen=True)
class FailOutcome:
    """The answer to a fail: OK with where the task went (READY, DELAYED or FAILED) and when it
    may run again, or FENCED / CANCELLED / STALE_INPUT when the claim was gone already."""

    outcome: Outcome
    reason: FenceReason = FenceReason.NONE
    message: str = ""
    state: TaskState | None = None
    next_eligible_at: datetime | None = None

    @property
    def recorded(self) -> bool:
        """Whether this call ended the attempt as failed."""
        return self.outcome is Outcome.OK

    @classmethod
    def from_proto(cls, msg: worker_pb2.FailResponse) -> Self:
        """Build from the wire message."""
        return cls(
            outcome=outcome_of(msg.outcome),
            reason=FenceReason(msg.reason),
            message=msg.message,
            state=TaskState(msg.state) if msg.state else None,
            next_eligible_at=timestamp(msg.next_eligible_at),
        )
