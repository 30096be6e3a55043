"""A held claim: its fence, a background keepalive, and the acceptance points (commit, ...).

The keepalive renews at TTL/3 in the background and never blocks the caller: one loop per
client renews all its claims, those due together in one RenewMany call (sdk/_renewer.py).
``progress()`` only records the latest marker, which the next renewal carries (older markers
are dropped).
A renewal the server refuses (FENCED, CANCELLED, STALLED, RENEW_LIMIT, STALE_INPUT), or a lease
that runs out by the local monotonic clock while renewals cannot reach the server, marks the claim
lost: flag, event and ``on_lost`` callback, once; the keepalive then stops. The SDK never claims
again or re-grants anything by itself: a lost claim stays lost.

``commit`` always asks the server, even for a claim the SDK believes lost: the store is the one
authority on the fence, and its answer carries the reason.

What a claim is apart from its keepalive and channel (its state, the requests it sends, what each
answer does to it) is in sdk/_core/held.py, and each acceptance point's request and answer in
sdk/_core/points.py, shared with the asyncio ``AsyncClaim``.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping, Sequence
from contextlib import suppress
from types import TracebackType
from typing import Self

from coordinator.errors import CoordinatorError
from coordinator.sdk._core.attempt import WorkerMethod
from coordinator.sdk._core.calls import Req, Resp
from coordinator.sdk._core.held import LostCallback
from coordinator.sdk._core.points import AcceptingClaim, AnswerT, Point
from coordinator.sdk._core.requests import (
    claim_key,
    claims_won,
)
from coordinator.sdk._duration import Duration, timeout_seconds
from coordinator.sdk._flag import Flag
from coordinator.sdk._jobstart import run_managed
from coordinator.sdk._renewer import Renewer
from coordinator.sdk._rpc import Rpc
from coordinator.sdk.effects import Downstream, EffectOutcome, run_effect
from coordinator.sdk.managed import DEFAULT_GRACE, ManagedProcess
from coordinator.sdk.types import (
    CommitOutcome,
    FailOutcome,
    ReleaseOutcome,
    StageOutcome,
    ToolAuthorization,
    TransportError,
)
from coordinator.v1 import worker_pb2

__all__ = ["Claim", "LostCallback"]


class Claim(AcceptingClaim):
    """One claimed task: the credential, the input, the lease clock and the keepalive.

    Use it as a context manager: entering starts the keepalive; leaving stops it and releases
    the task if the claim was neither committed, released nor lost. Built by WorkerClient.
    """

    def __init__(
        self,
        rpc: Rpc,
        claim: worker_pb2.ClaimResponse,
        *,
        sent_at: float,
        on_lost: LostCallback | None = None,
        safety_margin: Duration | None = None,
        clock: Callable[[], float] = time.monotonic,
        renewer: Renewer | None = None,
    ) -> None:
        super().__init__(
            claim, sent_at=sent_at, on_lost=on_lost, safety_margin=safety_margin, clock=clock
        )
        self._rpc = rpc
        self._stop = Flag()
        self._lost = Flag()
        # The client's keepalive loop (one for all its claims); a Claim built without one
        # gets a loop of its own when its keepalive starts.
        self._renewer = renewer
        self._own_renewer = renewer is None
        self._started = False

    def _signal(self, *, lost: bool) -> None:
        self._stop.set()
        if lost:
            self._lost.set()

    def wait_lost(self, timeout: Duration | None = None) -> bool:
        """Block until the claim is lost or ``timeout`` passes; returns ``is_lost()``."""
        return self._lost.wait(timeout_seconds(timeout))

    # --- acceptance points ----------------------------------------------------------------

    def call(self, method: WorkerMethod[Req, Resp], request: Req) -> Resp:
        """Call the WorkerService method ``method`` picks (``lambda worker: worker.Commit``)
        with ``request``, which carries this claim's fence: transport failures are retried until
        the retry budget or the lease by the local clock runs out."""
        return self._rpc.call(method(self._rpc.worker), request, lease_left=self.remaining())

    def _at(self, point: Point[AnswerT]) -> AnswerT:
        """Send one acceptance point behind the fence (in its retry window) and apply its
        answer; its ``first`` call before it, whose failure only leaves what it carried."""
        if point.first is not None:
            with suppress(CoordinatorError):
                self._at(point.first)
        window = point.window(self.remaining())
        return point.answer(self._rpc.call(point.method(self._rpc.worker), point.request, **window))

    def commit(
        self,
        result: bytes,
        *,
        result_ref: str = "",
        result_digest: str | None = None,
        evidence: Sequence[str] = (),
    ) -> CommitOutcome:
        """Make ``result`` canonical for the task revision, behind this claim's fence.

        Always reaches the server, even when the claim is believed lost: the answer is the truth.
        COMMITTED ends the claim (keepalive stops); FENCED / STALE_INPUT / CANCELLED mark it lost.
        ``result_digest`` is computed from ``result`` unless given (for a ``result_ref``).
        ``evidence`` (managed job ids and log refs, e.g. ``ManagedProcess.evidence``) is kept
        in the canonical result record.
        Transport failures are retried until the retry budget runs out, past the lease by the
        local clock too: the fence decides (a commit after a takeover is FENCED), and an etcd
        or coordinator outage longer than what was left of the lease no longer throws away a
        finished result (etcd keeps a lease across its own restart). Then OutcomeUnknown means
        a try may have landed: call ``commit`` again with the same result to learn it
        (COMMITTED if it landed); TransportError means none reached the server.
        """
        return self._at(self._commit_point(result, result_ref, result_digest, evidence))

    def commit_and_next(
        self,
        result: bytes,
        *,
        queue: str,
        ttl: Duration,
        max_tasks: int = 1,
        on_lost: LostCallback | None = None,
        result_ref: str = "",
        result_digest: str | None = None,
        evidence: Sequence[str] = (),
    ) -> tuple[CommitOutcome, list[Claim]]:
        """``commit``, and in the same call claim up to ``max_tasks`` ready tasks of ``queue``
        (CommitRequest.next): one round trip per task of a busy queue instead of two. Returns
        the commit's outcome and the claims won (none when nothing was ready, or the epoch
        moved on: claim with ``WorkerClient.claim_next`` then, which follows the new epoch).

        Retried as one call under a key of its own (``claim_key``): a retry whose first try
        landed gets that try's answer, next claims included, so a lost answer costs no
        attempt. Given up (TransportError), ``commit`` alone is tried; a next claim the lost
        answer carried is then held by nobody and expires with its lease."""
        point = self._commit_point(
            result, result_ref, result_digest, evidence, next_of=(queue, ttl, max_tasks)
        )
        sent = self._clock()
        try:
            response = self._rpc.call(
                self._rpc.worker.Commit,
                point.request,
                idempotency_key=claim_key(),
                **point.window(self.remaining()),
            )
        except TransportError:
            # Commit alone: a next claim the lost answer carried expires with its lease.
            alone = self._commit_point(result, result_ref, result_digest, evidence)
            return self._at(alone), []
        return point.answer(response), claims_of(
            self._rpc, response.next, sent_at=sent, on_lost=on_lost, renewer=self._renewer
        )

    def stage(
        self, result: bytes, *, result_ref: str = "", result_digest: str | None = None
    ) -> StageOutcome:
        """Stage ``result`` in this attempt's own area (never canonical by itself)."""
        return self._at(self._stage_point(result, result_ref, result_digest))

    def authorize_tool(self, tool: str, action: str = "") -> ToolAuthorization:
        """Ask the tool acceptance point before a side effect; falsy means do not run it."""
        return self._at(self._authorize_point(tool, action))

    def save_checkpoint(self, data: bytes) -> bool:
        """Record ``data`` as the checkpoint and store it now, before an expensive or
        irreversible step, instead of with the next renewal: True once the server kept it
        (False: the claim is lost, or the server did not keep it, ``last_checkpoint_refusal``
        says why; it stays pending and the next renewal sends it again)."""
        point = self._save_point(data)
        return self._at(point) if point is not None else False

    def release(self, reason: str = "") -> ReleaseOutcome:
        """Give the task back (READY again). Ends the claim; FENCED / CANCELLED mark it lost,
        except FENCED / ALREADY_COMMITTED or RELEASED: this attempt's own commit or release had
        landed (``committed`` then says so), e.g. one whose answer was lost (OutcomeUnknown)."""
        return self._at(self._release_point(reason))

    def fail(
        self,
        error: BaseException | str,
        *,
        retryable: bool = True,
        delay: Duration | None = None,
        message: str = "",
        details: bytes = b"",
        shutdown: bool = False,
    ) -> FailOutcome:
        """Report that this attempt failed; the coordinator decides by the task's retry policy
        whether it runs again (READY now, or DELAYED until its backoff or ``delay`` passes,
        whichever is later) or ends FAILED (``retryable=False``, a non-retryable error code, or
        no attempts left). ``error`` is an exception (its type name is the error code, its text
        the message, its traceback the details) or an error code. Ends the claim; FENCED /
        CANCELLED / STALE_INPUT mark it lost (unless this attempt had already ended itself).
        ``shutdown``: the task is given back because this worker is stopping, not failing: the
        attempt is not counted and no backoff applies (within a bound, FailRequest.shutdown);
        the pools give back so what a shutdown cuts off."""
        return self._at(self._fail_point(error, retryable, delay, message, details, shutdown))

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

        If the send's outcome is unknown, the reconciliation it opens is owned by this claim's
        worker, or by ``reconcile_principal`` (an operator, a reconciler service) if given: then
        no later claim may take it over, only that principal or an admin resolves it.
        FENCED / CANCELLED / STALE_INPUT from the coordinator mark the claim lost. Raises
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
        grace: Duration = DEFAULT_GRACE,
        log_dir: str | os.PathLike[str] | None = None,
    ) -> ManagedProcess:
        """Run ``argv`` as a managed job bound to this attempt (sdk/managed.py).

        The command starts only after StartJob accepted it behind this claim's fence; its whole
        process group is terminated (SIGTERM, SIGKILL after ``grace``) when this claim is lost or
        ends; its output goes to the returned handle's ``log_ref``. The keepalive must run
        (``with claim:``) for a loss to be noticed. Raises ClaimLost if StartJob was refused.
        """
        return run_managed(self, self._rpc, argv, cwd=cwd, env=env, grace=grace, log_dir=log_dir)

    # --- keepalive ------------------------------------------------------------------------

    def start(self) -> Self:
        """Start the background keepalive (idempotent): the client's keepalive loop renews
        this claim from now on (sdk/_renewer.py)."""
        if self._started or self._stop.is_set():
            return self
        self._started = True
        if self._renewer is None:
            self._renewer = Renewer(self._rpc, clock=self._clock)
        self._renewer.add(self)
        return self

    def close(self) -> None:
        """Stop the keepalive without releasing: an uncommitted task is reclaimed on expiry."""
        self._stop.set()
        if self._own_renewer and self._renewer is not None:
            self._renewer.close()

    def keepalive_wanted(self) -> bool:
        """Whether the keepalive loop should still renew this claim (the client's loop drops
        it once it ended, was lost or closed)."""
        return not self._stop.is_set()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        try:
            leave = self._leaving(exc)
            if leave is not None:
                try:
                    leave(self)
                except CoordinatorError as error:
                    self._release_failed(error)
        finally:
            self.close()

    def __repr__(self) -> str:
        return f"Claim({self._describe()})"


def claims_of(
    rpc: Rpc,
    response: worker_pb2.ClaimResponse,
    *,
    sent_at: float,
    on_lost: LostCallback | None = None,
    safety_margin: Duration | None = None,
    renewer: Renewer | None = None,
) -> list[Claim]:
    """The claims a ClaimNext answer (or a commit's next) won: its own, then more_claims; none
    when it was not CLAIMED."""
    return [
        Claim(
            rpc,
            claim,
            sent_at=sent_at,
            on_lost=on_lost,
            safety_margin=safety_margin,
            renewer=renewer,
        )
        for claim in claims_won(response)
    ]
