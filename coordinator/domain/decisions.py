"""The claim.v1 rules as pure functions: ``decide(what the store read, request) -> verdict``.

The store reads, calls one of these, and turns an accepting verdict into etcd compares and
puts; when a transaction's compares fail it reads again and calls the same function to name the
reason. Nothing here does I/O, so every rule is unit-tested without a server.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from coordinator.domain.records import AttemptRecord, ClaimRecord, ResultRecord, TaskRecord
from coordinator.domain.retry import RetryDefaults
from coordinator.domain.states import AttemptEnd, FenceReason, Outcome, TaskState
from coordinator.errors import InvalidArgument, PermissionDenied


@dataclass(frozen=True)
class Fence:
    """The credential a claim hands out; every acceptance point compares all of it."""

    task_id: str
    attempt_id: str
    claim_generation: int
    scheduler_epoch: int
    cancel_generation: int


@dataclass(frozen=True)
class Verdict:
    """An outcome with its reason and a sentence for people."""

    outcome: Outcome
    reason: FenceReason = FenceReason.NONE
    message: str = ""

    @property
    def accepted(self) -> bool:
        """Whether the call may go on to write."""
        return self.outcome in (Outcome.OK, Outcome.CLAIMED, Outcome.COMMITTED)


@dataclass(frozen=True)
class ClaimLimits:
    """Server-side bounds on a claim; workers cannot change them."""

    min_ttl: int = 2
    max_ttl: int = 300
    max_claim_duration: float = 3600.0
    stall_timeout: float = 600.0
    # Owned reconciliation of UNKNOWN effects (domain/reconcile.py): how long the owner has
    # before the task escalates to NEEDS_APPROVAL, and how many later claims may take it over.
    reconcile_timeout: float = 600.0
    reconcile_handoffs: int = 1
    # The retry policy a new task gets for the fields it leaves unset (domain/retry.py).
    retry: RetryDefaults = field(default_factory=RetryDefaults)


@dataclass(frozen=True)
class FenceView:
    """What the store read for one acceptance point, at one etcd revision."""

    task: TaskRecord
    attempt: AttemptRecord
    claim: ClaimRecord | None
    epoch: int
    result: ResultRecord | None = None


def clamp_ttl(requested: int, limits: ClaimLimits) -> int:
    """The TTL actually granted: ``requested`` clamped to ``[min_ttl, max_ttl]``."""
    return max(limits.min_ttl, min(limits.max_ttl, requested))


def decide_claim(
    task: TaskRecord,
    *,
    claim_alive: bool,
    expected_state_version: int,
    caller_epoch: int,
    current_epoch: int,
    paused: bool,
) -> Verdict:
    """Whether a claim of ``task`` may proceed. Claims come only from READY or expired CLAIMED."""
    if paused:
        return Verdict(Outcome.CLAIMS_PAUSED, message="new claims are paused by an admin")
    if caller_epoch != current_epoch:
        return Verdict(
            Outcome.FENCED,
            FenceReason.EPOCH_CHANGED,
            f"scheduler epoch is {current_epoch}, the claim carried {caller_epoch}",
        )
    if expected_state_version and expected_state_version != task.state_version:
        return Verdict(
            Outcome.STALE_STATE_VERSION,
            message=(
                f"task state_version is {task.state_version}, expected {expected_state_version}"
            ),
        )
    return _claimable(task, claim_alive=claim_alive)


def _claimable(task: TaskRecord, *, claim_alive: bool) -> Verdict:
    """Whether ``task``'s state lets a claim in: READY, or CLAIMED with an expired claim."""
    if task.state is TaskState.READY:
        return Verdict(Outcome.CLAIMED)
    if task.state is not TaskState.CLAIMED:
        return Verdict(Outcome.NOT_CLAIMABLE, message=f"task is {task.state.name}")
    if claim_alive:
        return Verdict(
            Outcome.ALREADY_CLAIMED,
            message=f"attempt {task.attempt_id} holds a live claim on the task",
        )
    return Verdict(Outcome.CLAIMED, message="previous claim expired")


def check_owner(view: FenceView, fence: Fence, principal: str) -> None:
    """Refuse a credential that is not the caller's, or whose parts do not belong together.

    These are errors, not outcomes: they mean a wrong or forged request, not a lost race.
    """
    attempt = view.attempt
    if attempt.owner_id != principal:
        raise PermissionDenied(
            f"attempt {attempt.attempt_id} of task {attempt.task_id} belongs to "
            f"{attempt.owner_id!r}, not to {principal!r}"
        )
    if attempt.claim_generation != fence.claim_generation:
        raise InvalidArgument(
            f"claim_generation {fence.claim_generation} does not belong to attempt "
            f"{attempt.attempt_id} (its generation is {attempt.claim_generation})"
        )
    # A cancel generation only grows, and a claim hands out the current one: one above the
    # task's was never handed out (answering CANCELLED would send the caller looking for a
    # cancellation that never happened).
    if fence.cancel_generation > view.task.cancel_generation:
        raise InvalidArgument(
            f"cancel_generation {fence.cancel_generation} was never handed out: the task's is "
            f"{view.task.cancel_generation}; send the fence the claim returned"
        )


def check_fence(view: FenceView, fence: Fence, *, now: float) -> Verdict:
    """Whether ``fence`` is the task's current credential at ``now`` (the server's clock);
    if not, why.

    Past the task's schedule_to_close deadline no attempt is current, even before the deadline
    pass has moved the task to FAILED: no result or effect lands after the deadline. That is
    FENCED with reason DEADLINE_EXCEEDED, never an outcome of its own, so Commit answers only
    claim.v1's four outcomes. The order matters only for the reported reason: cancellation,
    the deadline and input changes are the most specific, then the epoch, then the generation.
    """
    task = view.task
    moved = _task_moved_on(view, fence, now)
    if moved is not None:
        return moved
    if fence.scheduler_epoch != view.epoch:
        return Verdict(
            Outcome.FENCED,
            FenceReason.EPOCH_CHANGED,
            f"scheduler epoch is {view.epoch}, the attempt carried {fence.scheduler_epoch}",
        )
    if _holds_claim(view, fence):
        return Verdict(Outcome.OK)
    if task.claim_generation > fence.claim_generation:
        return Verdict(
            Outcome.FENCED,
            FenceReason.SUPERSEDED,
            f"generation {task.claim_generation} superseded generation {fence.claim_generation}",
        )
    return _lost_claim(view.attempt, fence)


def _task_moved_on(view: FenceView, fence: Fence, now: float) -> Verdict | None:
    """CANCELLED, FENCED (DEADLINE_EXCEEDED) or STALE_INPUT when the task itself left the
    attempt behind."""
    task, attempt = view.task, view.attempt
    if task.state is TaskState.CANCELLED or task.cancel_generation != fence.cancel_generation:
        return Verdict(
            Outcome.CANCELLED,
            message=f"task cancel_generation is {task.cancel_generation}, "
            f"the attempt observed {fence.cancel_generation}",
        )
    if task.deadline and now >= task.deadline:
        return _ENDED[AttemptEnd.TIMED_OUT]
    if task.revision != attempt.revision or task.input_digest != attempt.input_digest:
        return Verdict(
            Outcome.STALE_INPUT,
            message=f"task input is at revision {task.revision}, "
            f"the attempt ran on revision {attempt.revision}",
        )
    return None


def _lost_claim(attempt: AttemptRecord, fence: Fence) -> Verdict:
    """Why an attempt that was not superseded no longer holds its claim: how it ended, or
    (still running) its lease expired."""
    ended = _ENDED.get(attempt.end)
    if ended is not None:
        return ended
    return Verdict(
        Outcome.FENCED,
        FenceReason.LEASE_EXPIRED,
        f"the lease of generation {fence.claim_generation} expired",
    )


_ENDED: dict[AttemptEnd, Verdict] = {
    AttemptEnd.TIMED_OUT: Verdict(
        Outcome.FENCED,
        FenceReason.DEADLINE_EXCEEDED,
        "the task's schedule_to_close deadline passed: no attempt is current, and the task "
        "is FAILED (TIMED_OUT) by the deadline pass",
    ),
    AttemptEnd.RELEASED: Verdict(
        Outcome.FENCED, FenceReason.RELEASED, "the attempt released the task"
    ),
    AttemptEnd.FAILED: Verdict(
        Outcome.FENCED, FenceReason.FAILED, "the attempt reported its failure"
    ),
    AttemptEnd.COMMITTED: Verdict(
        Outcome.FENCED, FenceReason.ALREADY_COMMITTED, "the attempt has committed already"
    ),
    AttemptEnd.UNDELIVERED: Verdict(
        Outcome.FENCED,
        FenceReason.RELEASED,
        "the claim's answer could not be delivered (its caller had left); the task was given back",
    ),
}


def decide_stage(view: FenceView, *, now: float) -> Verdict:
    """Whether the attempt may stage a result at ``now``: any attempt of the caller may, even a
    fenced one (staging is never canonical), except once the task's deadline has ended it.

    Past schedule_to_close the attempt's work is over at every acceptance point alike, so a
    stage is refused FENCED (DEADLINE_EXCEEDED) and writes nothing, as commit would be.
    """
    ended = view.attempt.end is AttemptEnd.TIMED_OUT
    if ended or (view.task.deadline and now >= view.task.deadline):
        return _ENDED[AttemptEnd.TIMED_OUT]
    return Verdict(Outcome.OK)


@dataclass(frozen=True)
class CommitWrite:
    """Write the result now: the fence holds and the task revision has no canonical result."""

    @property
    def verdict(self) -> Verdict:
        """What the caller is told once the write landed."""
        return Verdict(Outcome.COMMITTED)


@dataclass(frozen=True)
class CommitReplay:
    """This attempt already wrote this result (a retry after a lost answer): answer COMMITTED
    again with the canonical result, and write nothing."""

    result: ResultRecord

    @property
    def verdict(self) -> Verdict:
        """What the caller is told."""
        return Verdict(Outcome.COMMITTED, message="already committed by this attempt")


@dataclass(frozen=True)
class CommitRefuse:
    """No write: the fence failed, the input moved, or another result is canonical."""

    verdict: Verdict


CommitDecision = CommitWrite | CommitReplay | CommitRefuse
"""One case per thing a commit can do, so no caller re-derives which one it was."""


def decide_commit(
    view: FenceView, fence: Fence, *, input_digest: str, result_digest: str, now: float
) -> CommitDecision:
    """Whether a commit writes its result, replays one it already wrote, or is refused.

    A retry of a commit that already landed (same attempt, same digest) is a replay, so a worker
    that lost the response can simply retry.
    """
    result = view.result
    if (
        result is not None
        and result.attempt_id == fence.attempt_id
        and result.result_digest == result_digest
    ):
        return CommitReplay(result)
    if input_digest != view.task.input_digest:
        return CommitRefuse(
            Verdict(
                Outcome.STALE_INPUT,
                message=f"task input digest is {view.task.input_digest}, the commit ran on "
                f"{input_digest}",
            )
        )
    verdict = check_fence(view, fence, now=now)
    if not verdict.accepted:
        return CommitRefuse(verdict)
    if result is not None:
        return CommitRefuse(
            Verdict(
                Outcome.FENCED,
                FenceReason.ALREADY_COMMITTED,
                f"revision {view.task.revision} already has canonical result {result.commit_id}",
            )
        )
    return CommitWrite()


PROGRESS_WRITE_INTERVAL = 5.0
"""Seconds a claim's progress marker is kept at least before a new one is written (a quarter
of the stall timeout if that is shorter): a worker's renewals each carrying a new 1,000
character marker for 1,000 claims wrote 4.2 MiB/s into etcd, uncharged."""


def progress_interval(claim: ClaimRecord) -> float:
    """How long ``claim``'s marker is kept before a new one is written: short enough that a
    worker whose marker moves is never taken for stalled."""
    if claim.stall_timeout > 0:
        return min(PROGRESS_WRITE_INTERVAL, claim.stall_timeout / 4)
    return PROGRESS_WRITE_INTERVAL


def decide_renew(
    claim: ClaimRecord, *, now: float, progress: str
) -> tuple[Verdict, ClaimRecord | None]:
    """Bounded renewal: never past the claim deadline, never for a stalled claim.

    Returns the verdict and, when the progress marker moved, the claim record to write back;
    a marker that moved sooner than ``progress_interval`` after the last one written is not
    written (the claim is not stalled: its marker moved), and a later renewal, which carries
    the latest marker, writes it.
    """
    if now + claim.ttl > claim.deadline:
        return (
            Verdict(
                Outcome.RENEW_LIMIT,
                message=f"the claim reaches max_claim_duration at {claim.deadline:.0f}; "
                "the lease is left to expire",
            ),
            None,
        )
    if progress != claim.progress:
        if now - claim.progress_at < progress_interval(claim):
            return Verdict(Outcome.OK), None
        updated = ClaimRecord(
            attempt_id=claim.attempt_id,
            owner_id=claim.owner_id,
            lease_id=claim.lease_id,
            ttl=claim.ttl,
            claimed_at=claim.claimed_at,
            deadline=claim.deadline,
            stall_timeout=claim.stall_timeout,
            progress=progress,
            progress_at=now,
            generation=claim.generation,
            mod_revision=claim.mod_revision,
        )
        return Verdict(Outcome.OK), updated
    if claim.stall_timeout > 0 and now - claim.progress_at > claim.stall_timeout:
        return (
            Verdict(
                Outcome.STALLED,
                message=f"no progress for {now - claim.progress_at:.0f}s "
                f"(stall_timeout {claim.stall_timeout:.0f}s); the lease is left to expire",
            ),
            None,
        )
    return Verdict(Outcome.OK), None


def _holds_claim(view: FenceView, fence: Fence) -> bool:
    task, claim = view.task, view.claim
    return (
        task.state is TaskState.CLAIMED
        and task.claim_generation == fence.claim_generation
        and claim is not None
        and claim.generation == fence.claim_generation
        and claim.attempt_id == fence.attempt_id
    )
