"""A held claim's acceptance points, each written once: the WorkerService method it calls, the
request it sends behind the claim's fence (sdk/_core/requests.py), and what the answer does to
the claim (sdk/_core/held.py). Pure, no I/O.

The sync ``Claim`` (sdk/claim.py) calls a ``Point``'s method and hands the answer to
``Point.answer``; the ``AsyncClaim`` (sdk/aio/claim.py) awaits the call. Neither builds a
request nor reads an answer itself.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Generic, TypeVar

from coordinator.fence_wire import fence_to_proto
from coordinator.sdk._core.held import HeldClaim
from coordinator.sdk._core.requests import (
    authorize_request,
    claim_next_request,
    commit_request,
    fail_request,
    release_request,
    stage_request,
)
from coordinator.sdk._duration import Duration
from coordinator.sdk._status import ATTEMPT_HINT
from coordinator.sdk.types import (
    CommitOutcome,
    FailOutcome,
    ReleaseOutcome,
    StageOutcome,
    ToolAuthorization,
)
from coordinator.v1 import types_pb2, worker_pb2

AnswerT = TypeVar("AnswerT")


@dataclass(frozen=True)
class Point(Generic[AnswerT]):
    """One call of an acceptance point: send ``request`` to the method ``method`` picks off a
    WorkerService stub (``lambda worker: worker.Commit``: sync or asyncio alike), and read the
    response with ``answer``."""

    method: Callable[[Any], Any]
    request: Any
    answer: Callable[[Any], AnswerT]
    # Retried no longer than the lease by the local clock. Not a commit's: the fence decides it
    # (FENCED after a takeover), and an outage longer than what was left of the lease threw a
    # finished result away although etcd still held the lease (it keeps one across a restart).
    within_lease: bool = True
    # Sent first, once, its failure ignored: the renewal that carries a checkpoint no renewal
    # kept yet, before a release or a failure ends the attempt (they carry none).
    first: Point[bool] | None = None
    retried: bool = True

    def window(self, lease_left: timedelta) -> dict[str, Any]:
        """The retry window of the call (``Rpc.call``'s keywords): ``lease_left``, or the
        whole retry budget, saying what to repeat as a fenced call does."""
        if not self.retried:
            return {"lease_left": lease_left, "retry": False}
        if self.within_lease:
            return {"lease_left": lease_left}
        return {"hint": ATTEMPT_HINT}


class AcceptingClaim(HeldClaim):
    """A held claim whose acceptance points are ``Point``s, for its shell to send."""

    def _commit_point(
        self,
        result: bytes,
        result_ref: str,
        result_digest: str | None,
        evidence: Sequence[str],
        *,
        next_of: tuple[str, Duration, int] | None = None,
    ) -> Point[CommitOutcome]:
        """Commit ``result``; with ``next_of`` (queue, ttl, max_tasks), claiming that many ready
        tasks of the queue in the same call (CommitRequest.next), under the claim's epoch."""
        request = commit_request(
            self.fence,
            self.input_digest,
            result,
            result_ref=result_ref,
            result_digest=result_digest,
            evidence=evidence,
        )
        if next_of is not None:
            queue, ttl, max_tasks = next_of
            epoch = self.fence.scheduler_epoch
            request.next.CopyFrom(
                claim_next_request(queue, ttl=ttl, epoch=epoch, max_tasks=max_tasks)
            )
        return Point(lambda worker: worker.Commit, request, self._committed, within_lease=False)

    def _stage_point(
        self, result: bytes, result_ref: str, result_digest: str | None
    ) -> Point[StageOutcome]:
        request = stage_request(
            self.fence, result, result_ref=result_ref, result_digest=result_digest
        )
        return Point(lambda worker: worker.StageResult, request, self._staged)

    def _authorize_point(self, tool: str, action: str) -> Point[ToolAuthorization]:
        request = authorize_request(self.fence, tool, action)
        return Point(lambda worker: worker.AuthorizeTool, request, self._authorized)

    def _release_point(self, reason: str) -> Point[ReleaseOutcome]:
        request = release_request(self.fence, reason)
        return Point(lambda worker: worker.Release, request, self._released, first=self._flush())

    def _fail_point(
        self,
        error: BaseException | str,
        retryable: bool,
        delay: Duration | None,
        message: str,
        details: bytes,
        shutdown: bool = False,
    ) -> Point[FailOutcome]:
        request = fail_request(
            self.fence,
            error,
            retryable=retryable,
            delay=delay,
            message=message,
            details=details,
            shutdown=shutdown,
        )
        return Point(lambda worker: worker.Fail, request, self._failed, first=self._flush())

    def _flush(self) -> Point[bool] | None:
        """One renewal, one try, that carries the checkpoint no renewal kept yet, for a release
        or a failure to send first: the next attempt resumes from it. None when nothing is
        pending. Only an accepted answer is applied: the ending call's answer is the truth
        about the claim."""
        return self._renewal_point(before_ending=True)

    def _save_point(self, data: bytes) -> Point[bool] | None:
        """``data`` recorded as the checkpoint and a renewal that carries it now, retried within
        the lease: True once the server kept it; a refusal (FENCED, CANCELLED) marks the claim
        lost. None when it is lost already."""
        self.checkpoint(data)
        return self._renewal_point(before_ending=False)

    def _renewal_point(self, *, before_ending: bool) -> Point[bool] | None:
        """A renewal that carries the pending checkpoint (None: none, or the claim is lost);
        its answer: whether the server accepted it and kept the checkpoint."""
        progress, checkpoint = self._lease.payload()
        if checkpoint is None or self.is_lost():
            return None
        fence = fence_to_proto(self.fence)
        request = worker_pb2.RenewRequest(fence=fence, progress=progress, checkpoint=checkpoint)
        sent = self._clock()

        def kept(response: worker_pb2.RenewResponse) -> bool:
            if response.outcome != types_pb2.OUTCOME_OK and before_ending:
                return False  # the ending call's own answer says what became of the claim
            refusals = self._lease.refusals[0]
            accepted = self.renewed(sent, response, request)
            return accepted and self._lease.refusals[0] == refusals

        return Point(lambda worker: worker.Renew, request, kept, retried=not before_ending)
