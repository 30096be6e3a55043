"""A held claim apart from its transport: its fence, lease clock (sdk/_core/lease.py) and
state, and what each answer does to it.

Pure bookkeeping, no I/O: the sync ``Claim`` (sdk/claim.py, a keepalive thread) and the asyncio
``AsyncClaim`` (sdk/aio/claim.py, a keepalive task) send the requests (sdk/_core/requests.py)
their own way and hand the answers back here, so both read an answer, lose a claim and report
the loss the same way. A subclass says how to stop its keepalive and wake its waiters
(``_signal``).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import structlog

from coordinator.domain import validation
from coordinator.domain.states import FenceReason, Outcome
from coordinator.errors import CoordinatorError
from coordinator.fence_wire import fence_from_proto, fence_to_proto
from coordinator.sdk._core.attempt import SentKeys
from coordinator.sdk._core.calls import CallRetry
from coordinator.sdk._core.lease import Lease
from coordinator.sdk._core.pool import SHUTDOWN_ERROR
from coordinator.sdk._duration import Duration, as_optional
from coordinator.sdk._flag import Flag
from coordinator.sdk.types import (
    ClaimLost,
    CommitOutcome,
    FailOutcome,
    LossSource,
    LostReason,
    ReleaseOutcome,
    StageOutcome,
    ToolAuthorization,
    TransportError,
    outcome_of,
    utc,
)
from coordinator.v1 import worker_pb2

log = structlog.get_logger("coordinator.sdk.claim")

LostCallback = Callable[[LostReason], None]
"""Called once, from the thread (or event loop) that noticed, when a claim is lost."""

# A renewal gets at least this long even when the local lease clock says time is up: the server
# may still hold the lease (the local clock starts when the request is sent, so it runs early).
_MIN_RENEW_TIMEOUT = 0.2


REPORT_WAIT = 5.0
"""Seconds a call that sees a loss another thread is reporting waits for its on_lost."""

# A renewal or release answered FENCED with these found that this attempt's own commit or
# release landed (its answer may still be on the way, or lost: OutcomeUnknown): the claim ended
# by the caller's hand, nothing was lost.
_ENDED_BY_THIS_ATTEMPT = {
    FenceReason.ALREADY_COMMITTED: "committed",
    FenceReason.RELEASED: "released",
    FenceReason.FAILED: "failed",
}


@dataclass
class _Ending:
    """How the claim ended, guarded by ``HeldClaim._lock``: set once, never cleared."""

    lost: LostReason | None = None
    # "committed", "released" or "failed" once the caller ended the claim; later losses are not
    # reported.
    finished: str = ""


class HeldClaim:
    """One claimed task: the credential, the input, the lease clock, and its state."""

    def __init__(
        self,
        claim: worker_pb2.ClaimResponse,
        *,
        sent_at: float,
        on_lost: LostCallback | None,
        safety_margin: Duration | None,
        clock: Callable[[], float],
    ) -> None:
        self._clock = clock
        self._on_lost = on_lost
        self.fence = fence_from_proto(claim.fence)
        self.attempt = claim.attempt
        self.input = claim.input
        self.input_digest = claim.input_digest
        self.task_revision = claim.task_revision
        # Where an earlier attempt of this task revision left the work (b"": start afresh).
        self.previous_checkpoint = claim.checkpoint
        self.ttl = timedelta(seconds=max(claim.ttl_seconds, 1))
        # Wire (seconds, nanos), as the lease end below: most claims never read either.
        deadline, lease = claim.claim_deadline, claim.lease_expires_at
        self._claim_deadline = (deadline.seconds, deadline.nanos)
        margin = as_optional(safety_margin, "safety_margin")
        self.safety_margin = margin if margin is not None else self.ttl / 4
        # A reused lease has less left than the TTL: the server says how much, clock-free.
        left = (
            claim.lease_remaining.ToNanoseconds() / 1e9 if claim.HasField("lease_remaining") else 0
        )
        self._lease = Lease(
            expires_at=sent_at + (left or self.ttl.total_seconds()),
            server_end=(lease.seconds, lease.nanos),
            clock=clock,
        )
        self._state = _Ending()
        self._lock = threading.Lock()
        self._sent_keys = SentKeys()
        # Set once the loss was reported (on_lost returned), by the thread that reported it.
        self._reported = Flag()
        self._reporter = 0

    def _signal(self, *, lost: bool) -> None:
        """The claim ended (``lost`` or finished): stop the keepalive, and wake whoever waits
        for a loss if ``lost``. Called once per kind, never under the lock."""
        raise NotImplementedError

    # --- identity and state ---------------------------------------------------------------

    @property
    def task_id(self) -> str:
        """The claimed task."""
        return self.fence.task_id

    @property
    def generation(self) -> int:
        """The claim generation (fencing token) of this attempt."""
        return self.fence.claim_generation

    @property
    def claim_deadline(self) -> datetime | None:
        """When the server stops accepting renewals (its clock: claim start + its longest
        claim duration); None if it did not say."""
        return utc(*self._claim_deadline)

    @property
    def lease_expires_at(self) -> datetime | None:
        """The lease end the server last reported (its clock; prefer ``remaining()``)."""
        return utc(*self._lease.server_end)

    @property
    def lost_reason(self) -> LostReason | None:
        """What lost the claim (outcome, fence reason, source), or None while it is held."""
        with self._lock:
            return self._state.lost

    @property
    def finished_as(self) -> str:
        """How the holder ended the claim ("committed", "released", "failed"), "" while it is
        held or if it was lost."""
        with self._lock:
            return self._state.finished

    @property
    def committed(self) -> bool:
        """Whether this claim's commit is known to have landed: answered COMMITTED, or found by a
        later renewal or release (after an OutcomeUnknown commit)."""
        with self._lock:
            return self._state.finished == "committed"

    @property
    def renewals(self) -> int:
        """How many renewals the server accepted."""
        return self._lease.renewals

    @property
    def checkpoint_refusals(self) -> int:
        """How many renewals the server accepted without keeping their checkpoint (a spent
        write budget, or etcd above the space guard's high water): each time the checkpoint
        stays pending and the next renewal sends it again."""
        return self._lease.refusals[0]

    @property
    def last_checkpoint_refusal(self) -> str:
        """The server's text for the last checkpoint it did not keep (which bound, when to
        retry); "" if none was refused."""
        return self._lease.refusals[1]

    @property
    def checkpoint_pending(self) -> bool:
        """Whether a checkpoint is recorded that no renewal has stored yet."""
        return self._lease.checkpoint_pending

    @property
    def sent_keys(self) -> SentKeys:
        """The effect keys this attempt sent downstream (sdk/effects.py)."""
        return self._sent_keys

    def is_lost(self) -> bool:
        """Whether the claim is known to have lost its task. Never blocks."""
        # One attribute read, atomic: no lock needed (set once, never cleared).
        return self._state.lost is not None

    def remaining(self) -> timedelta:
        """Time left on the lease by the local monotonic clock (zero once it ran out)."""
        return timedelta(seconds=max(self._lease.left(), 0.0))

    def check(self, *, margin: Duration | None = None) -> None:
        """Raise ClaimLost unless the claim is held with more than ``margin`` left on the lease.

        Call it before an expensive or irreversible step. ``margin`` defaults to the claim's
        ``safety_margin`` (a quarter of the TTL unless set at claim time).
        """
        with self._lock:
            lost, finished = self._state.lost, self._state.finished
        if lost is not None:
            raise ClaimLost(f"claim {self._name} is lost: {lost}", reason=lost)
        if finished:
            raise ClaimLost(f"claim {self._name} is {finished}: nothing left to work on")
        given = as_optional(margin, "margin")
        left, need = self.remaining(), given if given is not None else self.safety_margin
        if left < need:
            raise ClaimLost(
                f"claim {self._name} has {left.total_seconds():.2f}s left on its lease, "
                f"less than the {need.total_seconds():.2f}s safety margin"
            )

    def progress(self, marker: str) -> None:
        """Record a progress marker (at most 1,024 characters); the next renewal sends the
        latest one. Never blocks. InvalidArgument past the bound, here: the server would refuse
        the renewal that carried it, and the claim with it."""
        self._lease.record(progress=validation.text("progress", marker))

    def checkpoint(self, data: bytes) -> None:
        """Record where the work stands (at most 64 KiB); the next renewal stores it with the
        attempt (a release or a failure sends one renewal with it first), and a later attempt
        of the task revision starts with it as its ``previous_checkpoint``. Never blocks; only
        the latest one is sent. InvalidArgument past the bound, here: the server would refuse
        the renewal that carried it, and the claim with it."""
        limit = validation.MAX_CHECKPOINT_BYTES
        self._lease.record(checkpoint=validation.max_bytes("checkpoint", bytes(data), limit))

    # --- acceptance points: the requests and what their answers do --------------------------

    def _committed(self, response: worker_pb2.CommitResponse) -> CommitOutcome:
        """COMMITTED ends the claim; FENCED / STALE_INPUT / CANCELLED mark it lost."""
        outcome = CommitOutcome.from_proto(response)
        if outcome.committed:
            self._finish("committed")
        else:
            self.mark_lost(outcome.outcome, outcome.reason, outcome.message, LossSource.COMMIT)
        return outcome

    def _staged(self, response: worker_pb2.StageResultResponse) -> StageOutcome:
        """A refusal (the task's deadline passed) marks the claim lost."""
        answer = StageOutcome(
            outcome_of(response.outcome),
            response.current,
            response.message,
            FenceReason(response.reason),
        )
        if not answer.staged:
            self.mark_lost(answer.outcome, answer.reason, answer.message, LossSource.STAGE)
        return answer

    def _authorized(self, response: worker_pb2.AuthorizeToolResponse) -> ToolAuthorization:
        """A refusal marks the claim lost."""
        answer = ToolAuthorization(
            outcome_of(response.outcome), FenceReason(response.reason), response.message
        )
        if not answer.allowed:
            self.mark_lost(answer.outcome, answer.reason, answer.message, LossSource.AUTHORIZE)
        return answer

    def _released(self, response: worker_pb2.ReleaseResponse) -> ReleaseOutcome:
        """OK ends the claim; FENCED / CANCELLED mark it lost unless this attempt's own commit
        or release had landed."""
        answer = ReleaseOutcome(
            outcome_of(response.outcome), FenceReason(response.reason), response.message
        )
        if answer.released:
            self._finish("released")
        elif not self._ended_by_this_attempt(answer.outcome, answer.reason):
            self.mark_lost(answer.outcome, answer.reason, answer.message, LossSource.RELEASE)
        return answer

    def _failed(self, response: worker_pb2.FailResponse) -> FailOutcome:
        """Recorded ends the claim; FENCED / CANCELLED / STALE_INPUT mark it lost unless this
        attempt had already ended itself."""
        answer = FailOutcome.from_proto(response)
        if answer.recorded:
            self._finish("failed")
        elif not self._ended_by_this_attempt(answer.outcome, answer.reason):
            self.mark_lost(answer.outcome, answer.reason, answer.message, LossSource.FAIL)
        return answer

    def _leaving(self, exc: BaseException | None) -> Callable[[Any], Any] | None:
        """What leaving the claim's block (``exc``: what ended it) calls on the claim (a Claim's
        return, an AsyncClaim's coroutine); None when the claim needs nothing (committed,
        released or lost). An error of the work is a retryable failure (the retry policy counts
        it); leaving without one releases the task (counted: nothing was finished); leaving by
        KeyboardInterrupt / SystemExit / CancelledError (the worker stopping, not the task
        failing) gives it back as a shutdown (not counted, within the server's bound), as the
        pools do."""
        with self._lock:
            held = self._state.lost is None and not self._state.finished
        if not held:
            return None
        if isinstance(exc, Exception):
            return lambda claim: claim.fail(exc, retryable=True)
        if exc is None:
            return lambda claim: claim.release("left without commit")
        why = f"{type(exc).__name__}: {exc}"[:200]
        return lambda claim: claim.fail(SHUTDOWN_ERROR, message=why, shutdown=True)

    def _release_failed(self, error: CoordinatorError) -> None:
        # Never mask the caller's exception: the lease expires on its own.
        log.warning("release failed; the lease will expire", claim=self._name, error=str(error))

    # --- keepalive: one renewal's request and what its answer does (the client's keepalive
    # loop, sdk/_renewer.py, calls these; callers of the SDK never need them) ------------------

    def renewal_request(self, policy: CallRetry) -> tuple[worker_pb2.RenewRequest, float]:
        """The next renewal (with the latest progress marker) and its deadline: never past
        the lease by the local clock, never below _MIN_RENEW_TIMEOUT."""
        progress, checkpoint = self._lease.payload()
        budget = max(self.remaining().total_seconds(), _MIN_RENEW_TIMEOUT)
        request = worker_pb2.RenewRequest(fence=fence_to_proto(self.fence), progress=progress)
        if checkpoint is not None:
            request.checkpoint = checkpoint
        return request, min(policy.timeout.total_seconds(), budget)

    def renewal_failed(self, exc: CoordinatorError) -> None:
        """A renewal raised ``exc``: a transport failure loses the claim once the lease ran out
        locally; any other error loses it now."""
        if not isinstance(exc, TransportError):
            self.mark_lost(
                Outcome.FENCED, FenceReason.NONE, f"renewal refused: {exc}", LossSource.ERROR
            )
        elif self.remaining() <= timedelta(0):
            self.mark_lost(
                Outcome.FENCED,
                FenceReason.LEASE_EXPIRED,
                f"the lease ran out locally while renewals failed ({exc})",
                LossSource.LOCAL_EXPIRY,
            )

    def renewed(
        self,
        sent: float,
        response: worker_pb2.RenewResponse,
        request: worker_pb2.RenewRequest | None = None,
    ) -> bool:
        """Apply the answer to a renewal (``request``) sent at ``sent``; True if it was
        accepted. Marks the claim lost when the answer says so."""
        outcome = outcome_of(response.outcome)
        reason = FenceReason(response.reason)
        if self._ended_by_this_attempt(outcome, reason):
            return False
        if outcome is not Outcome.OK:
            self.mark_lost(outcome, reason, response.message, LossSource.RENEW)
            return False
        sent_checkpoint = request.checkpoint if request is not None else None
        if self._lease.renewed(sent, response, sent_checkpoint):
            count, refused = self._lease.refusals
            log.warning(
                "checkpoint not kept; sent again at the next renewal",
                claim=self._name,
                refusals=count,
                refused=refused,
            )
        return True

    def next_renewal(self, sent: float, accepted: bool) -> float:
        """When to renew next: TTL/3 after ``sent``, sooner after a failure (the lease is
        running out)."""
        interval = self.renewal_interval()
        return sent + (interval if accepted else interval / 4)

    def renewal_interval(self) -> float:
        """Seconds between accepted renewals: TTL/3."""
        return self.ttl.total_seconds() / 3

    def keepalive_crashed(self, exc: Exception) -> None:
        # A dead keepalive must never look like a healthy one.
        log.exception("keepalive crashed", claim=self._name)
        self.mark_lost(
            Outcome.FENCED, FenceReason.NONE, f"keepalive crashed: {exc!r}", LossSource.ERROR
        )

    # --- ending ---------------------------------------------------------------------------

    def _ended_by_this_attempt(self, outcome: Outcome, reason: FenceReason) -> bool:
        """Finish the claim (True) if a FENCED answer says this attempt's own commit or release
        landed; its own answer may never arrive."""
        how = _ENDED_BY_THIS_ATTEMPT.get(reason) if outcome is Outcome.FENCED else None
        if how is None:
            return False
        self._finish(how)
        return True

    def _finish(self, how: str) -> None:
        with self._lock:
            if not self._state.finished:
                self._state.finished = how
        self._signal(lost=False)

    def mark_lost(
        self, outcome: Outcome, reason: FenceReason, message: str, source: LossSource
    ) -> None:
        """Mark the claim lost because the coordinator refused it (``source`` says which call):
        flag, event, stop the keepalive, then the callback; once, and not after the claim was
        committed or released. The SDK's effect and managed-job helpers call it too.

        A call that finds the loss already being reported by another thread (the keepalive's
        renewal and the caller's commit can see it together) returns only once ``on_lost`` has
        run (at most REPORT_WAIT): whatever call tells the caller the claim is lost, the
        callback has been told first."""
        lost = LostReason(outcome, reason, message, source, self.task_id)
        with self._lock:
            if self._state.finished:
                return
            if self._state.lost is not None:
                reporter = self._reporter
                first = False
            else:
                self._state.lost = lost
                self._reporter = threading.get_ident()
                first = True
        if not first:
            if reporter != threading.get_ident():  # the callback itself may call the SDK
                self._reported.wait(REPORT_WAIT)
            return
        self._signal(lost=True)
        log.warning("claim lost", claim=self._name, generation=self.generation, lost=str(lost))
        try:
            if self._on_lost is not None:
                self._on_lost(lost)
        except Exception:
            log.exception("on_lost callback raised", claim=self._name)
        finally:
            self._reported.set()

    @property
    def _name(self) -> str:
        return f"{self.task_id}#{self.attempt}"

    def _describe(self) -> str:
        state = "lost" if self.is_lost() else self._state.finished or "held"
        return f"{self._name}, generation={self.generation}, {state}"
