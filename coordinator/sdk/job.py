"""A held claim: its fence, a background keepalive, and the acceptance points (commit, ...).

The keepalive renews at TTL/3 on its own thread and never blocks the caller: ``progress()``
only records the latest marker, which the next renewal carries (older markers are dropped).
A renewal the server refuses (FENCED, CANCELLED, STALLED, RENEW_LIMIT, STALE_INPUT), or a lease
that runs out by the local monotonic clock while renewals cannot reach the server, marks the job
lost: flag, event and ``on_lost`` callback, once; the keepalive then stops. The SDK never claims
again or re-grants anything by itself: a lost job stays lost.

``commit`` always asks the server, even for a job the SDK believes lost: the store is the one
authority on the fence, and its answer carries the reason.
"""

from __future__ import annotations

import os
import threading
import time
import traceback
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from types import TracebackType
from typing import Self

import structlog

from coordinator.domain.digests import digest_of
from coordinator.domain.states import FenceReason, Outcome
from coordinator.errors import CoordinatorError
from coordinator.sdk._flag import Flag
from coordinator.sdk._rpc import Req, Resp, Rpc
from coordinator.sdk.attempt import SentKeys, WorkerMethod
from coordinator.sdk.effects import Downstream, EffectOutcome, run_effect
from coordinator.sdk.managed import DEFAULT_GRACE, ManagedProcess, run_managed
from coordinator.sdk.types import (
    CommitOutcome,
    FailOutcome,
    Fence,
    JobLost,
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

log = structlog.get_logger(__name__)

LostCallback = Callable[[LostReason], None]
"""Called once, from the thread that noticed, when a job is lost."""

# A renewal gets at least this long even when the local lease clock says time is up: the server
# may still hold the lease (the local clock starts when the request is sent, so it runs early).
_MIN_RENEW_TIMEOUT = 0.2


# A renewal or release answered FENCED with these found that this attempt's own commit or
# release landed (its answer may still be on the way, or lost: OutcomeUnknown): the job ended
# by the caller's hand, nothing was lost.
_ENDED_BY_THIS_ATTEMPT = {
    FenceReason.ALREADY_COMMITTED: "committed",
    FenceReason.RELEASED: "released",
    FenceReason.FAILED: "failed",
}

# Bounds of what Fail carries (the server refuses more: INVALID_ARGUMENT).
_MAX_ERROR_MESSAGE = 1024
_MAX_ERROR_DETAILS = 16 * 1024


@dataclass
class _State:
    """The mutable part of a job, guarded by ``Job._lock``."""

    # When the lease ends by the local monotonic clock: send time of the last accepted call
    # plus the TTL it restored. Measured from the send, not the answer, so it errs early.
    expires_at: float
    # The server's lease end as wire (seconds, nanos): a datetime only when someone reads it.
    lease_expires_at: tuple[int, int]
    progress: str = ""
    # The latest checkpoint not yet accepted by a renewal (None: nothing new to send).
    checkpoint: bytes | None = None
    renewals: int = 0
    lost: LostReason | None = None
    # "committed", "released" or "failed" once the caller ended the job; later losses are not
    # reported.
    finished: str = ""


class Job:
    """One claimed task: the credential, the input, the lease clock and the keepalive.

    Use it as a context manager: entering starts the keepalive; leaving stops it and, if the job
    was neither committed, released, failed nor lost, reports it: an exception (an ``Exception``)
    escaping the block is a retryable failure with the exception's type and message (``fail``),
    so the task's retry policy counts and spaces it; a block left without one, or by
    KeyboardInterrupt / SystemExit (the worker stopping, not the task failing), releases the
    task. Built by WorkerClient.
    """

    def __init__(
        self,
        rpc: Rpc,
        claim: worker_pb2.ClaimResponse,
        *,
        sent_at: float,
        on_lost: LostCallback | None = None,
        safety_margin: timedelta | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._rpc = rpc
        self._clock = clock
        self._on_lost = on_lost
        self.fence = Fence.from_proto(claim.fence)
        self.attempt = claim.attempt
        self.input = claim.input
        self.input_digest = claim.input_digest
        self.task_revision = claim.task_revision
        # Where an earlier attempt of this task revision left the work (b"": start afresh).
        self.previous_checkpoint = claim.checkpoint
        self.ttl = timedelta(seconds=max(claim.ttl_seconds, 1))
        # Wire (seconds, nanos), as the lease end below: most jobs never read either.
        deadline, lease = claim.claim_deadline, claim.lease_expires_at
        self._claim_deadline = (deadline.seconds, deadline.nanos)
        self.safety_margin = safety_margin if safety_margin is not None else self.ttl / 4
        # A reused lease has less left than the TTL: the server says how much, clock-free.
        left = (
            claim.lease_remaining.ToNanoseconds() / 1e9 if claim.HasField("lease_remaining") else 0
        )
        self._state = _State(
            expires_at=sent_at + (left or self.ttl.total_seconds()),
            lease_expires_at=(lease.seconds, lease.nanos),
        )
        self._lock = threading.Lock()
        self._stop = Flag()
        self._lost = Flag()
        self._thread: threading.Thread | None = None
        self._sent_keys = SentKeys()

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
        with self._lock:
            seconds, nanos = self._state.lease_expires_at
        return utc(seconds, nanos)

    @property
    def lost_reason(self) -> LostReason | None:
        """What lost the job (outcome, fence reason, source), or None while it is held."""
        with self._lock:
            return self._state.lost

    @property
    def committed(self) -> bool:
        """Whether this job's commit is known to have landed: answered COMMITTED, or found by a
        later renewal or release (after an OutcomeUnknown commit)."""
        with self._lock:
            return self._state.finished == "committed"

    @property
    def renewals(self) -> int:
        """How many renewals the server accepted."""
        with self._lock:
            return self._state.renewals

    @property
    def sent_keys(self) -> SentKeys:
        """The effect keys this attempt sent downstream (sdk/effects.py)."""
        return self._sent_keys

    def is_lost(self) -> bool:
        """Whether the job is known to have lost its task. Never blocks."""
        return self._lost.is_set()

    def wait_lost(self, timeout: timedelta | None = None) -> bool:
        """Block until the job is lost or ``timeout`` passes; returns ``is_lost()``."""
        return self._lost.wait(timeout.total_seconds() if timeout is not None else None)

    def remaining(self) -> timedelta:
        """Time left on the lease by the local monotonic clock (zero once it ran out)."""
        with self._lock:
            left = self._state.expires_at - self._clock()
        return timedelta(seconds=max(left, 0.0))

    def check(self, *, margin: timedelta | None = None) -> None:
        """Raise JobLost unless the job is held with more than ``margin`` left on the lease.

        Call it before an expensive or irreversible step. ``margin`` defaults to the job's
        ``safety_margin`` (a quarter of the TTL unless set at claim time).
        """
        with self._lock:
            lost, finished = self._state.lost, self._state.finished
        if lost is not None:
            raise JobLost(f"job {self._name} is lost: {lost}", reason=lost)
        if finished:
            raise JobLost(f"job {self._name} is {finished}: nothing left to work on")
        left, need = self.remaining(), margin if margin is not None else self.safety_margin
        if left < need:
            raise JobLost(
                f"job {self._name} has {left.total_seconds():.2f}s left on its lease, "
                f"less than the {need.total_seconds():.2f}s safety margin"
            )

    def progress(self, marker: str) -> None:
        """Record a progress marker; the next renewal sends the latest one. Never blocks."""
        with self._lock:
            self._state.progress = marker

    def checkpoint(self, data: bytes) -> None:
        """Record where the work stands (at most 64 KiB); the next renewal stores it with the
        attempt, and a later attempt of the task revision starts with it as its
        ``previous_checkpoint``. Never blocks; only the latest one is sent."""
        with self._lock:
            self._state.checkpoint = bytes(data)

    # --- acceptance points ----------------------------------------------------------------

    def call(self, method: WorkerMethod[Req, Resp], request: Req) -> Resp:
        """Call the WorkerService method ``method`` picks (``lambda worker: worker.Commit``)
        with ``request``, which carries this job's fence: transport failures are retried until
        the retry budget or the lease by the local clock runs out."""
        return self._rpc.call(method(self._rpc.worker), request, lease_left=self.remaining())

    def commit(
        self,
        result: bytes,
        *,
        result_ref: str = "",
        result_digest: str | None = None,
        evidence: Sequence[str] = (),
    ) -> CommitOutcome:
        """Make ``result`` canonical for the task revision, behind this job's fence.

        Always reaches the server, even when the job is believed lost: the answer is the truth.
        COMMITTED ends the job (keepalive stops); FENCED / STALE_INPUT / CANCELLED mark it lost.
        ``result_digest`` is computed from ``result`` unless given (for a ``result_ref``).
        ``evidence`` (managed job ids and log refs, e.g. ``ManagedProcess.evidence``) is kept
        in the canonical result record.
        Transport failures are retried until the retry budget or the lease runs out. Then
        OutcomeUnknown means a try may have landed: call ``commit`` again with the same result
        to learn it (COMMITTED if it landed); TransportError means none reached the server.
        """
        request = worker_pb2.CommitRequest(
            fence=self.fence.to_proto(),
            input_digest=self.input_digest,
            result_digest=result_digest or digest_of(result),
            result=result,
            result_ref=result_ref,
            evidence=list(evidence),
        )
        response = self.call(lambda worker: worker.Commit, request)
        outcome = CommitOutcome.from_proto(response)
        if outcome.committed:
            self._finish("committed")
        else:
            self.mark_lost(outcome.outcome, outcome.reason, outcome.message, LossSource.COMMIT)
        return outcome

    def stage(
        self, result: bytes, *, result_ref: str = "", result_digest: str | None = None
    ) -> StageOutcome:
        """Stage ``result`` in this attempt's own area (never canonical by itself)."""
        request = worker_pb2.StageResultRequest(
            fence=self.fence.to_proto(),
            result_digest=result_digest or digest_of(result),
            result=result,
            result_ref=result_ref,
        )
        response = self.call(lambda worker: worker.StageResult, request)
        return StageOutcome(outcome_of(response.outcome), response.current, response.message)

    def authorize_tool(self, tool: str, action: str = "") -> ToolAuthorization:
        """Ask the tool acceptance point before a side effect; falsy means do not run it."""
        request = worker_pb2.AuthorizeToolRequest(
            fence=self.fence.to_proto(), tool=tool, action=action
        )
        response = self.call(lambda worker: worker.AuthorizeTool, request)
        answer = ToolAuthorization(
            outcome_of(response.outcome), FenceReason(response.reason), response.message
        )
        if not answer.allowed:
            self.mark_lost(answer.outcome, answer.reason, answer.message, LossSource.AUTHORIZE)
        return answer

    def release(self, reason: str = "") -> ReleaseOutcome:
        """Give the task back (READY again). Ends the job; FENCED / CANCELLED mark it lost,
        except FENCED / ALREADY_COMMITTED or RELEASED: this attempt's own commit or release had
        landed (``committed`` then says so), e.g. one whose answer was lost (OutcomeUnknown)."""
        request = worker_pb2.ReleaseRequest(fence=self.fence.to_proto(), reason=reason)
        response = self.call(lambda worker: worker.Release, request)
        answer = ReleaseOutcome(
            outcome_of(response.outcome), FenceReason(response.reason), response.message
        )
        if answer.released:
            self._finish("released")
        elif not self._ended_by_this_attempt(answer.outcome, answer.reason):
            self.mark_lost(answer.outcome, answer.reason, answer.message, LossSource.RELEASE)
        return answer

    def fail(
        self,
        error: BaseException | str,
        *,
        retryable: bool = True,
        delay: timedelta | None = None,
        message: str = "",
        details: bytes = b"",
    ) -> FailOutcome:
        """Report that this attempt failed; the coordinator decides by the task's retry policy
        whether it runs again (READY now, or DELAYED until its backoff or ``delay`` passes,
        whichever is later) or ends FAILED (``retryable=False``, a non-retryable error code, or
        no attempts left). ``error`` is an exception (its type name is the error code, its text
        the message, its traceback the details) or an error code. Ends the job; FENCED /
        CANCELLED / STALE_INPUT mark it lost (unless this attempt had already ended itself)."""
        if isinstance(error, BaseException):
            code = type(error).__name__
            message = message or str(error)
            details = details or "".join(traceback.format_exception(error)).encode()
        else:
            code = error
        request = worker_pb2.FailRequest(
            fence=self.fence.to_proto(),
            retryable=retryable,
            error_code=code,
            error_message=message[:_MAX_ERROR_MESSAGE],
            # The end of a traceback is the part that names the failure.
            error_details=details[-_MAX_ERROR_DETAILS:],
        )
        if delay is not None:
            request.requeue_delay.FromTimedelta(delay)
        answer = FailOutcome.from_proto(self.call(lambda worker: worker.Fail, request))
        if answer.recorded:
            self._finish("failed")
        elif not self._ended_by_this_attempt(answer.outcome, answer.reason):
            self.mark_lost(answer.outcome, answer.reason, answer.message, LossSource.FAIL)
        return answer

    def effect(
        self,
        node_id: str,
        effect_slot: str,
        payload: bytes,
        downstream: Downstream,
        *,
        reconcile_principal: str = "",
    ) -> EffectOutcome:
        """Perform the side effect of one slot at most once across every attempt of the task
        revision: prepare, then execute / skip / reconcile, then record (sdk/effects.py).

        If the send's outcome is unknown, the reconciliation it opens is owned by this job's
        worker, or by ``reconcile_principal`` (an operator, a reconciler service) if given: then
        no later claim may take it over, only that principal or an admin resolves it.
        FENCED / CANCELLED / STALE_INPUT from the coordinator mark the job lost. Raises
        TransportError / OutcomeUnknown if the coordinator could not be reached within the
        retry budget or the lease (the effect stays uncertain; repeating the call is safe).
        """
        return run_effect(
            self,
            node_id,
            effect_slot,
            payload,
            downstream,
            reconcile_principal=reconcile_principal,
        )

    def run(
        self,
        argv: Sequence[str],
        *,
        cwd: str | os.PathLike[str] | None = None,
        env: Mapping[str, str] | None = None,
        grace: timedelta = DEFAULT_GRACE,
        log_dir: str | os.PathLike[str] | None = None,
    ) -> ManagedProcess:
        """Run ``argv`` as a managed job bound to this attempt (sdk/managed.py).

        The command starts only after StartJob accepted it behind this job's fence; its whole
        process group is terminated (SIGTERM, SIGKILL after ``grace``) when this job is lost or
        ends; its output goes to the returned handle's ``log_ref``. The keepalive must run
        (``with job:``) for a loss to be noticed. Raises JobLost if StartJob was refused.
        """
        return run_managed(self, self._rpc, argv, cwd=cwd, env=env, grace=grace, log_dir=log_dir)

    # --- keepalive ------------------------------------------------------------------------

    def start(self) -> Self:
        """Start the background keepalive (idempotent)."""
        if self._thread is None and not self._stop.is_set():
            self._thread = threading.Thread(
                target=self._keepalive, name=f"keepalive-{self._name}", daemon=True
            )
            self._thread.start()
        return self

    def close(self) -> None:
        """Stop the keepalive without releasing: an uncommitted task is reclaimed on expiry."""
        self._stop.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            # A renewal in flight ends by its deadline, which never exceeds the RPC timeout.
            thread.join(self._rpc.policy.timeout.total_seconds())

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        try:
            with self._lock:
                held = self._state.lost is None and not self._state.finished
            if held:
                try:
                    if isinstance(exc, Exception):
                        self.fail(exc, retryable=True)
                    else:
                        why = "left without commit" if exc is None else type(exc).__name__
                        self.release(why)
                except CoordinatorError as error:
                    # Never mask the caller's exception: the lease expires on its own.
                    log.warning(
                        "could not hand the task back; the lease will expire",
                        job=self._name,
                        error=str(error),
                    )
        finally:
            self.close()

    def _keepalive(self) -> None:
        interval = self.ttl.total_seconds() / 3
        next_at = self._clock() + interval
        try:
            while not self._stop.wait(max(next_at - self._clock(), 0.0)):
                sent = self._clock()
                # After a transport failure try again sooner: the lease is running out.
                next_at = sent + (interval if self._renew_once(sent) else interval / 4)
        except Exception as exc:  # a dead keepalive must never look like a healthy one
            log.exception("keepalive crashed", job=self._name)
            self.mark_lost(
                Outcome.FENCED, FenceReason.NONE, f"keepalive crashed: {exc!r}", LossSource.ERROR
            )

    def _renew_once(self, sent: float) -> bool:
        """One renewal; True if accepted. Marks the job lost when the answer says so."""
        with self._lock:
            progress, checkpoint = self._state.progress, self._state.checkpoint
        budget = max(self.remaining().total_seconds(), _MIN_RENEW_TIMEOUT)
        request = worker_pb2.RenewRequest(fence=self.fence.to_proto(), progress=progress)
        if checkpoint is not None:
            request.checkpoint = checkpoint
        try:
            # No SDK retries here: this loop is the retry, and each try ends before the lease.
            response = self._rpc.call(
                self._rpc.worker.Renew,
                request,
                retry=False,
                timeout=min(self._rpc.policy.timeout.total_seconds(), budget),
            )
            outcome = outcome_of(response.outcome)
        except TransportError as exc:
            if self.remaining() <= timedelta(0):
                self.mark_lost(
                    Outcome.FENCED,
                    FenceReason.LEASE_EXPIRED,
                    f"the lease ran out locally while renewals failed ({exc})",
                    LossSource.LOCAL_EXPIRY,
                )
            return False
        except CoordinatorError as exc:
            self.mark_lost(
                Outcome.FENCED, FenceReason.NONE, f"renewal refused: {exc}", LossSource.ERROR
            )
            return False
        reason = FenceReason(response.reason)
        if self._ended_by_this_attempt(outcome, reason):
            return False
        if outcome is not Outcome.OK:
            self.mark_lost(outcome, reason, response.message, LossSource.RENEW)
            return False
        with self._lock:
            self._state.expires_at = sent + max(response.ttl_seconds, 1)
            lease = response.lease_expires_at
            self._state.lease_expires_at = (lease.seconds, lease.nanos)
            self._state.renewals += 1
            if self._state.checkpoint is checkpoint:  # sent and kept; nothing newer since
                self._state.checkpoint = None
        return True

    # --- ending ---------------------------------------------------------------------------

    def _ended_by_this_attempt(self, outcome: Outcome, reason: FenceReason) -> bool:
        """Finish the job (True) if a FENCED answer says this attempt's own commit or release
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
        self._stop.set()

    def mark_lost(
        self, outcome: Outcome, reason: FenceReason, message: str, source: LossSource
    ) -> None:
        """Mark the job lost because the coordinator refused it (``source`` says which call):
        flag, event, stop the keepalive, then the callback; once, and not after the job was
        committed or released. The SDK's effect and managed-job helpers call it too."""
        lost = LostReason(outcome, reason, message, source)
        with self._lock:
            if self._state.lost is not None or self._state.finished:
                return
            self._state.lost = lost
        self._stop.set()
        self._lost.set()
        log.warning("job lost", job=self._name, generation=self.generation, lost=str(lost))
        if self._on_lost is not None:
            try:
                self._on_lost(lost)
            except Exception:
                log.exception("on_lost callback raised", job=self._name)

    @property
    def _name(self) -> str:
        return f"{self.task_id}#{self.attempt}"

    def __repr__(self) -> str:
        state = "lost" if self.is_lost() else self._state.finished or "held"
        return f"Job({self._name}, generation={self.generation}, {state})"
