"""Claims whose answer nobody heard: a claim call cancelled as its answer came.

An asyncio caller cancelled while awaiting ``claim_next`` (``asyncio.timeout``, a TaskGroup, a
shutdown) just as the answer arrived drops it: the answer was in, but the coroutine had not
resumed to take it when the cancellation was thrown in instead. The server had handed that
answer to gRPC, so it gave nothing back, and the task stayed CLAIMED by nobody until its lease
ran out, its attempt then counted (the outside probe: 9 of 19 cancelled calls).

The client's transport hands such an answer here (``AsyncRpc.call``'s ``heard``: the call had
completed, not been cancelled), and each claim it won is given back at once as a shutdown
(``Fail``, ``shutdown``: not counted, within the server's allowance), in a task of its own;
``close()`` waits for them. A call cancelled before its answer came is cancelled on the wire
too, and the server gives back what it wins for a caller that is gone.
"""

from __future__ import annotations

import asyncio
from contextlib import suppress

import structlog

from coordinator.errors import CoordinatorError
from coordinator.fence_wire import fence_from_proto
from coordinator.sdk._core.pool import SHUTDOWN_ERROR
from coordinator.sdk._core.requests import claims_won, fail_request
from coordinator.sdk.aio._rpc import AsyncRpc
from coordinator.v1 import worker_pb2

log = structlog.get_logger(__name__)

GIVE_BACK_TIMEOUT = 5.0
"""Seconds each give-back may take (one try: the claim's lease ends it otherwise)."""

UNHEARD = "the claim call was cancelled as its answer came"
"""The message of the give-back."""


class Unheard:
    """The give-backs of claims whose call was cancelled as their answer came."""

    def __init__(self, rpc: AsyncRpc) -> None:
        self._rpc = rpc
        self._running: set[asyncio.Task[None]] = set()

    def give_back(self, response: worker_pb2.ClaimResponse) -> None:
        """Give back every claim ``response`` won (nobody holds them)."""
        won = claims_won(response)
        if not won:
            return
        task = asyncio.ensure_future(self._give_back(won))
        self._running.add(task)
        task.add_done_callback(self._running.discard)

    async def close(self) -> None:
        """Wait for the give-backs still running."""
        await asyncio.gather(*self._running, return_exceptions=True)

    async def _give_back(self, won: list[worker_pb2.ClaimResponse]) -> None:
        for claim in won:
            request = fail_request(
                fence_from_proto(claim.fence),
                SHUTDOWN_ERROR,
                retryable=True,
                delay=None,
                message=UNHEARD,
                details=b"",
                shutdown=True,
            )
            with suppress(CoordinatorError):
                await self._rpc.call(
                    self._rpc.worker.Fail, request, retry=False, timeout=GIVE_BACK_TIMEOUT
                )
                log.info("claim given back: its call was cancelled", task_id=claim.fence.task_id)
