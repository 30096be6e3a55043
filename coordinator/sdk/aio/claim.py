"""AsyncClaim: a held claim kept alive by the client's keepalive task, whose calls are awaited.

The same claim as the sync ``Claim`` (sdk/claim.py): the state, the requests and what every
answer does are shared (sdk/_core/held.py, sdk/_core/points.py). The keepalive renews at TTL/3
from the client's one keepalive task (all its claims due together in one RenewMany,
sdk/aio/_renewer.py) and never blocks the caller, as long as the caller does not block the
loop: run CPU-bound or blocking work with ``asyncio.to_thread`` (a loop blocked past the lease
loses the claim, as a frozen process would). A loss is reported once: ``is_lost()``, ``await
wait_lost()``, and the ``on_lost`` callback, called on the loop (it must not block either).

An AsyncClaim belongs to the event loop it was claimed on; use it from that loop only.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from contextlib import suppress
from types import TracebackType
from typing import Self

from coordinator.errors import CoordinatorError
from coordinator.sdk._core.calls import Req, Resp
from coordinator.sdk._core.effects import EffectOutcome
from coordinator.sdk._core.held import LostCallback
from coordinator.sdk._core.points import AcceptingClaim, AnswerT, Point
from coordinator.sdk._core.requests import (
    claim_key,
    claims_won,
)
from coordinator.sdk._duration import Duration, timeout_seconds
from coordinator.sdk.aio._events import wait_for
from coordinator.sdk.aio._renewer import AsyncRenewer
from coordinator.sdk.aio._rpc import AsyncRpc, AsyncWorkerMethod
from coordinator.sdk.aio.effects import AsyncDownstream, run_effect
from coordinator.sdk.types import (
    CommitOutcome,
    FailOutcome,
    ReleaseOutcome,
    StageOutcome,
    ToolAuthorization,
    TransportError,
)
from coordinator.v1 import worker_pb2


class AsyncClaim(AcceptingClaim):
    """One claimed task, for asyncio: the credential, the input, the lease clock and the
    keepalive task.

    Use it as an async context manager: entering starts the keepalive; leaving stops it and,
    if the claim was neither committed, released nor lost, reports an escaping exception as a
    retryable failure or else releases the task (as ``Claim``). Built by AsyncWorkerClient.
    """

    def __init__(
        self,
        rpc: AsyncRpc,
        claim: worker_pb2.ClaimResponse,
        *,
        sent_at: float,
        on_lost: LostCallback | None = None,
        safety_margin: Duration | None = None,
        clock: Callable[[], float] = time.monotonic,
        renewer: AsyncRenewer | None = None,
    ) -> None:
        super().__init__(
            claim, sent_at=sent_at, on_lost=on_lost, safety_margin=safety_margin, clock=clock
        )
        self._rpc = rpc
        self._stop = asyncio.Event()
        self._lost = asyncio.Event()
        # The client's keepalive loop (one task for all its claims); an AsyncClaim built
        # without one gets a loop of its own when its keepalive starts.
        self._renewer = renewer
        self._own_renewer = renewer is None
        self._started = False

    def _signal(self, *, lost: bool) -> None:
        self._stop.set()
        if lost:
            self._lost.set()

    async def wait_lost(self, timeout: Duration | None = None) -> bool:
        """Wait until the claim is lost or ``timeout`` passes; returns ``is_lost()``."""
        return await wait_for(self._lost, timeout_seconds(timeout))

    # --- acceptance points ----------------------------------------------------------------

    async def call(self, method: AsyncWorkerMethod[Req, Resp], request: Req) -> Resp:
        """Call the WorkerService method ``method`` picks (``lambda worker: worker.Commit``)
        with ``request``, which carries this claim's fence: transport failures are retried until
        the retry budget or the lease by the local clock runs out."""
        return await self._rpc.call(method(self._rpc.worker), request, lease_left=self.remaining())

    async def _at(self, point: Point[AnswerT]) -> AnswerT:
        """Send one acceptance point behind the fence (in its retry window) and apply its
        answer; its ``first`` call before it, whose failure only leaves what it carried."""
        if point.first is not None:
            with suppress(CoordinatorError):
                await self._at(point.first)
        window = point.window(self.remaining())
        call = self._rpc.call(point.method(self._rpc.worker), point.request, **window)
        return point.answer(await call)

    async def commit(
        self,
        result: bytes,
        *,
        result_ref: str = "",
        result_digest: str | None = None,
        evidence: Sequence[str] = (),
    ) -> CommitOutcome:
        """Make ``result`` canonical for the task revision, behind this claim's fence; as
        ``Claim.commit``: always asks the server, COMMITTED ends the claim, FENCED / STALE_INPUT /
        CANCELLED mark it lost, OutcomeUnknown means commit the same result again to learn it;
        retried for the whole retry budget, past the local lease too (the fence decides).
        """
        return await self._at(self._commit_point(result, result_ref, result_digest, evidence))

    async def commit_and_next(
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
    ) -> tuple[CommitOutcome, list[AsyncClaim]]:
        """``commit``, and in the same call claim up to ``max_tasks`` ready tasks of ``queue``
        (CommitRequest.next), as ``Claim.commit_and_next``: one logical call under a key of its
        own, so a retry whose first try landed gets that try's answer, next claims included;
        given up (TransportError), ``commit`` alone is tried, and a next claim the lost answer
        carried is held by nobody and expires with its lease."""
        point = self._commit_point(
            result, result_ref, result_digest, evidence, next_of=(queue, ttl, max_tasks)
        )
        sent = self._clock()
        try:
            response = await self._rpc.call(
                self._rpc.worker.Commit,
                point.request,
                idempotency_key=claim_key(),
                **point.window(self.remaining()),
            )
        except TransportError:
            # Commit alone: a next claim the lost answer carried expires with its lease.
            alone = self._commit_point(result, result_ref, result_digest, evidence)
            return await self._at(alone), []
        return point.answer(response), async_claims_of(
            self._rpc, response.next, sent_at=sent, on_lost=on_lost, renewer=self._renewer
        )

    async def stage(
        self, result: bytes, *, result_ref: str = "", result_digest: str | None = None
    ) -> StageOutcome:
        """Stage ``result`` in this attempt's own area (never canonical by itself)."""
        return await self._at(self._stage_point(result, result_ref, result_digest))

    async def authorize_tool(self, tool: str, action: str = "") -> ToolAuthorization:
        """Ask the tool acceptance point before a side effect; falsy means do not run it."""
        return await self._at(self._authorize_point(tool, action))

    async def save_checkpoint(self, data: bytes) -> bool:
        """``Claim.save_checkpoint``: the checkpoint stored now; True once the server kept it."""
        point = self._save_point(data)
        return await self._at(point) if point is not None else False

    async def release(self, reason: str = "") -> ReleaseOutcome:
        """Give the task back (READY again); as ``Claim.release``."""
        return await self._at(self._release_point(reason))

    async def fail(
        self,
        error: BaseException | str,
        *,
        retryable: bool = True,
        delay: Duration | None = None,
        message: str = "",
        details: bytes = b"",
        shutdown: bool = False,
    ) -> FailOutcome:
        """Report that this attempt failed; as ``Claim.fail``: the task's retry policy decides
        whether it runs again (READY now, or DELAYED until its backoff or ``delay``, whichever
        is later) or ends FAILED. ``error`` is an exception (type name, text and traceback go
        along) or an error code. Ends the claim; FENCED / CANCELLED / STALE_INPUT mark it lost
        (unless this attempt had already ended itself). ``shutdown`` as ``Claim.fail``."""
        return await self._at(self._fail_point(error, retryable, delay, message, details, shutdown))

    async def effect(
        self,
        node_id: str,
        effect_slot: str,
        payload: bytes,
        downstream: AsyncDownstream,
        *,
        reconcile_principal: str = "",
    ) -> EffectOutcome:
        """Perform the side effect of one slot at most once across every attempt of the task
        revision: the protocol of ``Claim.effect`` (sdk/effects.py), with an async downstream
        (``ThreadedDownstream`` runs a sync one, e.g. HttpDownstream, in a thread)."""
        return await run_effect(
            self,
            node_id,
            effect_slot,
            payload,
            downstream,
            reconcile_principal=reconcile_principal,
        )

    # --- keepalive ------------------------------------------------------------------------

    def start(self) -> Self:
        """Start the keepalive (idempotent): the client's keepalive task renews this claim from
        now on (sdk/aio/_renewer.py). Call it on the claim's event loop."""
        if self._started or self._stop.is_set():
            return self
        self._started = True
        if self._renewer is None:
            self._renewer = AsyncRenewer(self._rpc, clock=self._clock)
        self._renewer.add(self)
        return self

    async def close(self) -> None:
        """Stop the keepalive without releasing: an uncommitted task is reclaimed on expiry."""
        self._stop.set()
        if self._own_renewer and self._renewer is not None:
            await self._renewer.close()

    def keepalive_wanted(self) -> bool:
        """Whether the keepalive loop should still renew this claim."""
        return not self._stop.is_set()

    async def __aenter__(self) -> Self:
        return self.start()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        try:
            leave = self._leaving(exc)
            if leave is not None:
                try:
                    await leave(self)
                except CoordinatorError as error:
                    self._release_failed(error)
        finally:
            await self.close()

    def __repr__(self) -> str:
        return f"AsyncClaim({self._describe()})"


def async_claims_of(
    rpc: AsyncRpc,
    response: worker_pb2.ClaimResponse,
    *,
    sent_at: float,
    on_lost: LostCallback | None = None,
    safety_margin: Duration | None = None,
    renewer: AsyncRenewer | None = None,
) -> list[AsyncClaim]:
    """The AsyncClaims a ClaimNext answer (or a commit's next) won: its own, then more_claims;
    none when it was not CLAIMED."""
    return [
        AsyncClaim(
            rpc,
            claim,
            sent_at=sent_at,
            on_lost=on_lost,
            safety_margin=safety_margin,
            renewer=renewer,
        )
        for claim in claims_won(response)
    ]
